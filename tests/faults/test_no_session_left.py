"""A stopped FleetWatch leaves no PostgreSQL session behind, whether it stopped cleanly or failed
to start (real PostgreSQL, real `fleetwatch server` processes and in-process apps).

A session left open in a long-lived process is a connection the pool no longer knows: it holds a
backend on the database until the garbage collector happens to close it, with a ResourceWarning
in whatever runs at that moment. Each process's sessions are named in ``pg_stat_activity``
(``fleetwatch <role>``), the pool's and its own ones (the leader's lock, the LISTEN watchers),
so that an operator can tell which process holds a backend.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from fleetwatch.config import ServerSettings
from fleetwatch.errors import SchemaOutOfDate
from fleetwatch.server.app import create_app
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from tests.conftest import TEST_SECRET_KEY, throwaway_postgres
from tests.faults.waiting import wait_for
from tests.integration.live import FLEETWATCH, create_token, free_port, live_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def database() -> Iterator[str]:
    """A database of this test's own: any session on it is one this test's code opened."""
    with throwaway_postgres() as url:
        yield url


def _sessions(url: str) -> list[str]:
    """The application names of the sessions on ``url``'s database (from another database)."""
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = %s"
            " AND pid <> pg_backend_pid()",
            (parsed.database,),
        ).fetchall()
    return sorted(str(name) for (name,) in rows)


def _migrated(url: str) -> str:
    db = Database(make_engine(ServerSettings(database_url=url)))
    try:
        upgrade(db.engine)
    finally:
        db.dispose()
    return url


def _settings(url: str, role: str) -> ServerSettings:
    return ServerSettings(  # type: ignore[call-arg]
        database_url=url,
        role=role,
        background_jobs=True,
        secret_keys=[TEST_SECRET_KEY],
        _env_file=None,
    )


def _none_left(url: str) -> None:
    # A backend ends a moment after its client closed the socket: wait for it, never race it.
    wait_for(f"no session left on {url}", lambda: _sessions(url) == [], timeout=60)


def test_an_app_that_failed_to_start_leaves_no_session(database: str) -> None:
    # Not migrated: the start fails after the engine has opened a connection to look.
    app = create_app(_settings(database, "all"))
    with pytest.raises(SchemaOutOfDate), TestClient(app):
        pass
    assert _sessions(database) == [], "the failed start's pooled connection is still open"


def test_an_app_stopped_cleanly_leaves_no_session(database: str) -> None:
    _migrated(database)
    with TestClient(create_app(_settings(database, "all"))) as client:
        # The leader's lock session and a long-poll's LISTEN session are open now, named.
        seen = wait_for(
            "the leader's session and the pool's",
            lambda: (names := _sessions(database)).count("fleetwatch all") >= 2 and names,
        )
        assert set(seen) == {"fleetwatch all"}, seen
        assert client.get("/healthz").status_code == 200
    _none_left(database)


@pytest.mark.parametrize("role", ["api", "worker", "all"])
def test_each_server_process_leaves_no_session(database: str, role: str, tmp_path: Path) -> None:
    _migrated(database)
    token = create_token(database, "read")
    assert _sessions(database) == [], "making a token left a session"
    with live_server(database, tmp_path, "--role", role) as server:
        with server.client(token) as client:
            # A long-poll opens the eviction watcher's LISTEN session of this process.
            assert client.get("/v1/evictions", params={"wait": 1}).status_code == 200
        names = _sessions(database)
        assert names and set(names) == {f"fleetwatch {role}"}, names
    _none_left(database)


def test_a_server_process_that_failed_to_start_leaves_no_session(database: str) -> None:
    # Not migrated: the server looks, refuses to start, and exits non-zero.
    refused = subprocess.run(
        [*FLEETWATCH, "server", "--port", str(free_port()), "--database-url", database],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0
    assert "fleetwatch db upgrade" in refused.stderr, refused.stderr
    _none_left(database)
