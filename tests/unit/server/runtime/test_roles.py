"""Roles and the one leader: SQLite serves one process; roles decide who competes to lead."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import make_url
from tests.conftest import TEST_SECRET_KEY

from fleetwatch.cli import main
from fleetwatch.config import ServerSettings
from fleetwatch.errors import ConfigError
from fleetwatch.server.app import create_app
from fleetwatch.server.runtime.leader import LEADER_LOCK, WAKE_CHANNEL, single_process_problem


def _settings(database_url: str, **values: object) -> ServerSettings:
    return ServerSettings(  # type: ignore[call-arg]
        database_url=database_url,
        metrics_require_token=False,
        secret_keys=[TEST_SECRET_KEY],
        refit_interval_s=0,
        _env_file=None,
        **values,
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--workers", "2"], "--workers 2"), (["--role", "api"], "--role api"),
     (["--role", "worker"], "--role worker")],
)  # fmt: skip
def test_sqlite_refuses_several_processes(tmp_path: Path, args: list[str], named: str) -> None:
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    result = CliRunner().invoke(main, ["server", "--database-url", url, *args])
    assert result.exit_code != 0
    assert named in result.output and "PostgreSQL" in result.output, result.output
    assert not (tmp_path / "fw.db").exists(), "refused before touching the database"


def test_sqlite_one_process_of_role_all_is_fine(tmp_path: Path) -> None:
    assert single_process_problem(_settings(f"sqlite:///{tmp_path / 'a.db'}")) is None
    with pytest.raises(ConfigError, match="SQLite serves one process"):
        create_app(_settings(f"sqlite:///{tmp_path / 'a.db'}", workers=2))


def test_postgresql_allows_several_processes() -> None:
    url = "postgresql+psycopg://fw@db.example/fleetwatch"
    assert single_process_problem(_settings(url, workers=4, role="api")) is None


def _metric(client: TestClient, prefix: str) -> str:
    lines = client.get("/metrics").text.splitlines()
    return next(line for line in lines if line.startswith(prefix))


def _wait(condition: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def test_sqlite_process_leads_and_says_so(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(f"sqlite:///{tmp_path / 'a.db'}"))) as client:
        assert _wait(lambda: client.get("/readyz").json()["leader"] is True)
        assert _metric(client, "fleetwatch_leader{") == 'fleetwatch_leader{role="all"} 1.0'


@pytest.fixture
def held_lock(migrated_postgres_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Another "process" holding the leader lock on the test database."""
    url = make_url(migrated_postgres_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        assert conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone() == (True,)
        yield conn


@pytest.mark.postgres
def test_api_role_never_competes(migrated_postgres_url: str) -> None:
    with TestClient(create_app(_settings(migrated_postgres_url, role="api"))) as client:
        assert client.app.state.elector is None  # type: ignore[attr-defined]
        body = client.get("/readyz").json()
        assert body["role"] == "api" and body["leader"] is False
        assert _metric(client, "fleetwatch_leader{") == 'fleetwatch_leader{role="api"} 0.0'


@pytest.mark.postgres
def test_worker_waits_for_the_lock_then_leads_and_hears_wakes(
    migrated_postgres_url: str, held_lock: psycopg.Connection[tuple[object, ...]]
) -> None:
    # Timers an hour apart: only the leadership change and the NOTIFY make the assessment rerun.
    settings = _settings(migrated_postgres_url, role="worker", assess_interval_s=3600)
    with TestClient(create_app(settings)) as client:

        def runs() -> float:
            metric = _metric(client, 'fleetwatch_background_runs_total{job="assessment"}')
            return float(metric.split()[-1])

        assert _wait(lambda: runs() >= 1), "a standby keeps its read-only assessment"
        timed = _metric(client, 'fleetwatch_background_pass_seconds_count{job="assessment"}')
        assert float(timed.split()[-1]) >= 1, "each completed pass is timed"
        assert client.get("/readyz").json()["leader"] is False, "someone else holds the lock"
        held_lock.execute("SELECT pg_advisory_unlock(%s)", (LEADER_LOCK,))
        assert _wait(lambda: client.get("/readyz").json()["leader"] is True)
        assert _metric(client, "fleetwatch_leader{") == 'fleetwatch_leader{role="worker"} 1.0'
        assert _wait(lambda: runs() >= 2), "a new leader judges at once"
        before = runs()
        held_lock.execute(f"NOTIFY {WAKE_CHANNEL}")
        assert _wait(lambda: runs() > before), "a NOTIFY from any replica wakes the leader"
