"""Engine construction: the same code path for the embedded SQLite file and PostgreSQL.

:meth:`Database.write` is the one place every write passes through, so it is also where a full
disk is recognised: the driver's error becomes :class:`~fleetwatch.errors.StorageFull` (507) and
is remembered in :attr:`Database.storage` for ``/readyz``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.pool import StaticPool

from fleetwatch.config import ServerSettings
from fleetwatch.errors import StorageFull
from fleetwatch.server.db.idle_ping import ping_when_idle
from fleetwatch.server.db.storage import DRIVER_ERRORS, StorageHealth, disk_full_reason

__all__ = ["Database", "make_engine", "own_conninfo", "sqlite_directory"]

# An execution option of our own: the application_name the engine gives its connections.
_APPLICATION_NAME = "fleetwatch_application_name"


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not pysqlite, decide when transactions begin (pysqlite's own handling
    # defers BEGIN and breaks SAVEPOINT and isolation).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # FULL: an acknowledged batch survives power loss, not only a process crash.
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def _postgres_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Every session in UTC, whatever the server's default: timestamps come back with psycopg's
    # own UTC tzinfo, which UtcDateTime passes through as they are (a conversion per timestamp
    # read was 2 % of a fleet-scale worker's CPU).
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'UTC'")
    dbapi_connection.commit()


def _sqlite_on_begin(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN")


def make_engine(settings: ServerSettings) -> Engine:
    url = settings.database_url
    if settings.is_sqlite:
        in_memory = url in ("sqlite://", "sqlite:///:memory:")
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False},
            # One shared connection for an in-memory database, or every thread sees its own.
            poolclass=StaticPool if in_memory else None,
        )
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    # Each session says which role it works for in pg_stat_activity (and so which process a
    # backend's CPU and locks belong to), unless the database URL names one itself.
    named = "application_name" in make_url(url).query
    name = f"fleetwatch {settings.role}"
    engine = create_engine(
        url,
        connect_args={} if named else {"application_name": name},
        # Remembered for the connections a process opens outside the pool (own_conninfo).
        execution_options={} if named else {_APPLICATION_NAME: name},
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        # psycopg takes bytes; msgspec encodes the newest-state JSON of every pushed GPU
        # several times faster than json.dumps (5 % of an API process's CPU at fleet scale).
        json_serializer=msgspec.json.encode,
        # And reads it back several times faster than json.loads: a /metrics shard decodes the
        # newest state of each of its ~3,000 GPUs at every scrape (PostgreSQL's json type
        # holds only standard JSON, so nothing json.loads alone accepts, NaN say, is stored).
        json_deserializer=msgspec.json.decode,
    )
    event.listen(engine, "connect", _postgres_on_connect)
    ping_when_idle(engine)  # instead of pool_pre_ping's round trip before every transaction
    return engine


def own_conninfo(engine: Engine) -> str:
    """libpq connection string for a PostgreSQL connection of its own, outside the engine's pool
    (LISTEN, the leader's advisory lock), named in ``pg_stat_activity`` like the pool's."""
    import psycopg.conninfo  # PostgreSQL only

    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    name = engine.get_execution_options().get(_APPLICATION_NAME)
    return psycopg.conninfo.make_conninfo(url, application_name=name) if name else url


def sqlite_directory(engine: Engine) -> Path | None:
    """The directory of the engine's SQLite file; None for PostgreSQL and in-memory SQLite."""
    name = engine.url.database
    if engine.dialect.name != "sqlite" or not name or name == ":memory:":
        return None
    return Path(name).resolve().parent


class Database:
    """The engine plus a writer lock: SQLite allows one writer, so our threads take turns politely
    instead of colliding into SQLITE_BUSY; PostgreSQL needs no lock."""

    def __init__(self, engine: Engine, *, storage: StorageHealth | None = None) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock() if self.is_sqlite else None
        self.storage = storage or StorageHealth(sqlite_directory(engine))

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection in a transaction that commits on success and rolls back on error.

        A full disk (on the body's statements or the commit) raises :class:`StorageFull`; the
        transaction is rolled back, so nothing of it was stored.
        """
        try:
            with self._write_lock or nullcontext(), self.engine.begin() as conn:
                yield conn
        except DRIVER_ERRORS as exc:
            reason = disk_full_reason(exc, self.storage.directory)
            if reason is None:
                raise
            self.storage.failed(reason)
            raise StorageFull(reason) from exc

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()
