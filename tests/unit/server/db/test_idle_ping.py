"""Pooled PostgreSQL connections are pinged before use only after sitting idle (real
PostgreSQL; the clock is injected, the ping counted by wrapping the dialect's own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, exc, text

from fleetwatch.server.db.idle_ping import ping_when_idle

pytestmark = pytest.mark.postgres


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def engine(postgres_url: str, clock: _Clock) -> Iterator[Engine]:
    engine = create_engine(postgres_url, pool_size=1, max_overflow=0)
    ping_when_idle(engine, trusted_idle_s=1.0, clock=clock)
    yield engine
    engine.dispose()


@pytest.fixture
def pings(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    done: list[int] = []
    real = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        done.append(1)
        return real(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return done


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(postgres_url: str, pid: int) -> None:
    dsn = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # Until the backend is gone: the pooled connection must find it dead, not dying.
        # Generous: a loaded CI machine may take its time to reap it.
        for _ in range(6000):
            gone = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            if gone.fetchone() == (0,):
                return
            admin.execute("SELECT pg_sleep(0.01)")
    raise AssertionError(f"backend {pid} still there after about a minute")


def _killed_connection(engine: Engine, postgres_url: str) -> int:
    """Return the pool's one connection, then kill its backend; the dead backend's pid."""
    pid = _backend_pid(engine)
    _terminate(postgres_url, pid)
    return pid


def test_a_connection_reused_within_the_trusted_idle_time_is_not_pinged(
    engine: Engine, clock: _Clock, pings: list[int]
) -> None:
    first = _backend_pid(engine)  # a new connection: never returned, so pinged
    clock.now += 0.5
    assert _backend_pid(engine) == first
    clock.now += 0.9
    assert _backend_pid(engine) == first
    assert len(pings) == 1


def test_a_connection_idle_longer_is_pinged_each_time(
    engine: Engine, clock: _Clock, pings: list[int]
) -> None:
    _backend_pid(engine)
    clock.now += 1.5
    _backend_pid(engine)
    clock.now += 3600
    _backend_pid(engine)
    assert len(pings) == 3


def test_an_idle_connection_whose_backend_died_is_replaced_before_use(
    engine: Engine, clock: _Clock, postgres_url: str
) -> None:
    first = _killed_connection(engine, postgres_url)
    clock.now += 5
    second = _backend_pid(engine)  # no error: the ping found it dead and the pool reconnected
    assert second != first


def test_a_backend_that_died_within_the_trusted_time_fails_one_statement_then_recovers(
    engine: Engine, clock: _Clock, postgres_url: str
) -> None:
    first = _killed_connection(engine, postgres_url)
    clock.now += 0.1
    with pytest.raises(exc.OperationalError):
        _backend_pid(engine)
    assert _backend_pid(engine) != first  # SQLAlchemy invalidated it on the disconnect


def test_an_error_other_than_a_disconnect_is_not_swallowed(
    engine: Engine, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _backend_pid(engine)
    clock.now += 5

    def broken(_dbapi_connection: Any) -> bool:
        raise psycopg.errors.InsufficientPrivilege("not a disconnect")

    monkeypatch.setattr(engine.dialect, "do_ping", broken)
    with pytest.raises(exc.DBAPIError, match="not a disconnect"):
        _backend_pid(engine)
