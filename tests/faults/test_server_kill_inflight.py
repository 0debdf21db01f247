"""``kill -9`` of the server while ingest requests are in flight, with three real agents running.

The agents (``sim`` collector) push through a loopback proxy to a `fleetwatch server` process on
PostgreSQL. Three rounds, each ending in ``kill -9`` and a restart on the same port:

- *inside the database*: the test holds ``LOCK TABLE gpu_sample_blocks IN ACCESS EXCLUSIVE
  MODE`` from its own connection, so ingest transactions block on it; the server is killed while
  they wait, then the lock is released (the orphaned transactions must not commit);
- *after the commit*: the proxy holds the server's answers; the server is killed with stored
  batches unacknowledged, and the agents see dropped connections (their retries must not
  store anything twice);
- *inside the database* again, under the agents' backoff from the previous rounds.

At the end every collected sample is stored exactly once: 0 lost, 0 duplicated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from fleetwatch.server.db.tables import metadata
from fleetwatch.sim.spec import FleetSpec
from tests.faults.holdproxy import HoldProxy
from tests.faults.ledger import tally
from tests.faults.waiting import wait_for as _until
from tests.integration.live import (
    AgentProcess,
    LiveServer,
    create_token,
    fleetwatch,
    free_port,
    live_server,
    start_agent,
    stop_agents,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

AGENTS = 3
ROUNDS = ("lock", "answers", "lock")


@pytest.fixture
def empty_postgres(migrated_postgres_url: str) -> str:
    engine = create_engine(migrated_postgres_url)
    names = ", ".join(t.name for t in reversed(metadata.sorted_tables))
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return migrated_postgres_url


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _stored(monitor: psycopg.Connection[tuple[int]]) -> int:
    row = monitor.execute("SELECT coalesce(sum(n), 0) FROM gpu_sample_blocks").fetchone()
    return int(row[0]) if row else 0


def _waiting_on_samples(monitor: psycopg.Connection[tuple[int]]) -> int:
    """Lock requests waiting on the sample table or a partition of it (a push takes the DEFAULT
    partition before its COPY: server/db/partitions.py). From the catalog: pg_partition_tree()
    would itself wait for the locked table."""
    row = monitor.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation IN "
        "(SELECT 'gpu_sample_blocks'::regclass UNION ALL SELECT inhrelid FROM pg_inherits "
        "WHERE inhparent = 'gpu_sample_blocks'::regclass)"
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _server(url: str, log_dir: Path, port: int) -> Iterator[LiveServer]:
    with live_server(url, log_dir, port=port) as server:
        yield server


def _kill_9(server: LiveServer) -> None:
    server.process.kill()  # SIGKILL: no shutdown, no cleanup, connections cut mid-request
    server.process.wait()


def test_server_killed_inside_inflight_requests_loses_and_duplicates_nothing(
    empty_postgres: str, tmp_path: Path
) -> None:
    url = empty_postgres
    fleetwatch("sim", "init", "--nodes", str(AGENTS), "--gpus", "2", "--seed", "11",
               "--out", str(tmp_path / "sim"))  # fmt: skip
    spec = tmp_path / "sim" / "fleet.json"
    names = [FleetSpec.load(spec).node_name(i) for i in range(AGENTS)]
    agent_token = create_token(url, "agent")
    port = free_port()
    proxy = HoldProxy(port)
    # A monitor query that waits on a lock fails the test within 30 s instead of hanging it.
    monitor: psycopg.Connection[tuple[int]] = psycopg.connect(
        _libpq(url), autocommit=True, options="-c statement_timeout=30000"
    )
    agents: list[AgentProcess] = []
    seen: list[str] = []
    with ExitStack() as cleanup:
        cleanup.callback(proxy.close)
        cleanup.callback(monitor.close)
        server = cleanup.enter_context(_server(url, tmp_path, port))
        agents = [
            start_agent(name, proxy.url, agent_token, tmp_path / "agents",
                        "--collectors", "sim", "--sim-spec", str(spec), interval_s=0.5)
            for name in names
        ]  # fmt: skip
        cleanup.callback(lambda: stop_agents(agents))  # on failure too
        for kind in ROUNDS:
            before = _stored(monitor)
            _until("traffic", lambda before=before: _stored(monitor) > before)  # type: ignore[misc]
            if kind == "lock":
                locker = psycopg.connect(_libpq(url))
                cleanup.callback(locker.close)  # closed below too; this one on failure
                locker.execute("LOCK TABLE gpu_sample_blocks IN ACCESS EXCLUSIVE MODE")
                _until("ingest blocked on the lock", lambda: _waiting_on_samples(monitor) >= 2)
                waiting = _waiting_on_samples(monitor)
                _kill_9(server)
                locker.rollback()  # the orphaned transactions get the table, then their end
                locker.close()
                seen.append(f"killed with {waiting} ingest transactions waiting on the lock")
            else:
                with proxy.holding():
                    _until("answers held", lambda: proxy.held_connections >= 2)
                    held = proxy.held_connections
                    _kill_9(server)
                    _until("held answers dropped", lambda: proxy.held_connections == 0)
                dropped = ", ".join(proxy.dropped_answers[-held:])
                seen.append(
                    f"killed with {held} answers held after the server's commit ({dropped})"
                )
                assert all(" 200 " in line for line in proxy.dropped_answers), "not stored first"
            server = cleanup.enter_context(_server(url, tmp_path, port))
        _until(
            "spools drained",
            lambda: all(a.metric("fleetwatch_agent_spool_batches") == 0 for a in agents),
        )
        logs = stop_agents(agents)
    result = tally(url, agents, logs)
    for number, line in enumerate(seen, 1):
        print(f"kill -9 #{number}: {line}")
    print(f"{len(seen)} kills under {AGENTS} agents: {result.line()}")
    assert result.spooled == 0
    assert result.batches >= 10 and result.collected > 0
    assert (result.lost, result.duplicated) == (0, 0), result.line()
    assert result.stored_batches == result.batches, result.line()  # each batch once, as a batch
    assert not any("rejected batch" in log for log in logs.values()), "a batch was refused"
