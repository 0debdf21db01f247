"""PostgreSQL restarted twice under several server processes and three real agents.

A throwaway cluster of the test's own (tests/faults/pgcluster.py, never the shared server) is
migrated; two `fleetwatch server` processes run on it, one of them with ``--workers 2``; three
agents (``sim`` collector) push, one to the first server and two to the second. PostgreSQL is
restarted mid-traffic, once with ``-m fast`` and once with ``-m immediate`` (no checkpoint: a
crash and recovery). After each restart both servers answer ``/readyz`` 200 again and every
node's telemetry is stored again; at the end every collected sample is stored exactly once.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from fleetwatch.sim.spec import FleetSpec
from tests.faults.ledger import tally
from tests.faults.pgcluster import throwaway_cluster
from tests.faults.waiting import wait_for as _until
from tests.integration.live import (
    AgentProcess,
    LiveServer,
    create_token,
    fleetwatch,
    live_server,
    start_agent,
    stop_agents,
)

pytestmark = pytest.mark.slow

AGENTS = 3
RESTARTS = ("fast", "immediate")


def _stored_by_node(url: str) -> Counter[str]:
    """Samples stored per node; empty while the database is down."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT n.name, sum(s.n) FROM gpu_sample_blocks s JOIN nodes n ON n.id = s.node_id "
                "GROUP BY n.name"
            ).fetchall()
    except psycopg.OperationalError:
        return Counter()
    return Counter({name: int(count) for name, count in rows})


def _ready(server: LiveServer) -> int:
    try:
        return httpx.get(f"{server.url}/readyz", timeout=5).status_code
    except httpx.TransportError:
        return 0


class ReadyzWatch:
    """Polls the servers' /readyz on a thread while PostgreSQL restarts: what they answered."""

    def __init__(self, servers: list[LiveServer]) -> None:
        self.answers: Counter[int] = Counter()
        self._servers = servers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyzWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for server in self._servers:
                self.answers[_ready(server)] += 1


def test_postgres_restarts_under_two_servers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    fleetwatch("sim", "init", "--nodes", str(AGENTS), "--gpus", "2", "--seed", "13",
               "--out", str(tmp_path / "sim"))  # fmt: skip
    spec = tmp_path / "sim" / "fleet.json"
    names = [FleetSpec.load(spec).node_name(i) for i in range(AGENTS)]
    seen: list[str] = []
    agents: list[AgentProcess] = []
    with throwaway_cluster() as pg, ExitStack() as cleanup:
        url = pg.url
        fleetwatch("db", "upgrade", "--database-url", url)
        agent_token = create_token(url, "agent")
        one = cleanup.enter_context(live_server(url, tmp_path))
        two = cleanup.enter_context(live_server(url, tmp_path, "--workers", "2"))
        servers = [one, two, two]  # the first agent pushes to the first server, two to the other
        agents = [
            start_agent(name, server.url, agent_token, tmp_path / "agents",
                        "--collectors", "sim", "--sim-spec", str(spec), interval_s=0.5)
            for name, server in zip(names, servers, strict=True)
        ]  # fmt: skip
        cleanup.callback(lambda: stop_agents(agents))  # on failure too
        for mode in RESTARTS:
            before = _stored_by_node(url)
            _until("traffic from every node",
                   lambda before=before: all(_stored_by_node(url)[n] > before[n] for n in names))  # type: ignore[misc]  # fmt: skip
            with ReadyzWatch([one, two]) as watch:
                pg.restart(mode)
                for server in (one, two):
                    server.wait_ready()  # /readyz 200 on both servers
            restarted = _stored_by_node(url)
            _until("every node stored again",
                   lambda restarted=restarted: all(  # type: ignore[misc]
                       _stored_by_node(url)[n] > restarted[n] for n in names))  # fmt: skip
            assert one.process.poll() is None and two.process.poll() is None, "a server died"
            answers = ", ".join(
                f"{code or 'no answer'}: {n}" for code, n in sorted(watch.answers.items())
            )
            seen.append(f"pg_ctl restart -m {mode}; /readyz meanwhile {answers}; recovered")
        # Each agent's backlog is gone once its spool has been seen empty. Not all three empty at
        # one poll: they keep collecting every 0.5 s, and on loaded cores one of them nearly
        # always holds a fresh batch (a run waited 120 s for that and failed).
        emptied: set[int] = set()

        def drained() -> bool:
            emptied.update(
                i for i, a in enumerate(agents) if a.metric("fleetwatch_agent_spool_batches") == 0
            )
            return len(emptied) == len(agents)

        _until("spools drained", drained)
        logs = stop_agents(agents)
        result = tally(url, agents, logs)
    for number, line in enumerate(seen, 1):
        print(f"restart #{number}: {line}")
    print(f"{len(seen)} PostgreSQL restarts under 2 servers (3 workers), {AGENTS} agents: "
          f"{result.line()}")  # fmt: skip
    assert result.spooled == 0
    assert result.batches >= 10 and result.collected > 0
    assert (result.lost, result.duplicated) == (0, 0), result.line()
    assert result.stored_batches == result.batches, result.line()
    assert not any("rejected batch" in log for log in logs.values()), "a batch was refused"
