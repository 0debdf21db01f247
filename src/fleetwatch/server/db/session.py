"""Engine construction: the same code path for the embedded SQLite file and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import StaticPool

from fleetwatch.config import ServerSettings

__all__ = ["Database", "make_engine"]


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
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
    )


class Database:
    """The engine plus a writer lock: SQLite allows one writer, so our threads take turns politely
    instead of colliding into SQLITE_BUSY; PostgreSQL needs no lock."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock() if self.is_sqlite else None

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection in a transaction that commits on success and rolls back on error."""
        if self._write_lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._write_lock, self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()
