"""Several real `fleetwatch server` processes on one PostgreSQL: who leads, what each has run, and
what the leader did, counted in the database.

The servers answer /metrics without a token (``FLEETWATCH_SERVER_METRICS_REQUIRE_TOKEN=false``):
the tests poll it often to see the leader and its passes (``fleetwatch_background_runs_total``).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from sqlalchemy import func, select, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import alerts, evictions, node_slowness
from tests.faults.waiting import wait_for
from tests.integration.live import LiveServer, live_server

__all__ = [
    "Fleet",
    "is_leader",
    "kill_leader",
    "leaders",
    "metric",
    "push",
    "report",
    "runs",
    "start",
    "the_leader",
]


def metric(server: LiveServer, prefix: str) -> float | None:
    """The value of the first /metrics line starting with ``prefix``, None if it does not
    answer or has no such line."""
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
    except httpx.TransportError:
        return None
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return None


def is_leader(server: LiveServer) -> bool:
    return metric(server, "fleetwatch_leader{") == 1.0


def runs(server: LiveServer, job: str) -> float:
    """Passes of ``job`` this process has finished (0 before the first, or when it is gone)."""
    return metric(server, f'fleetwatch_background_runs_total{{job="{job}"}}') or 0.0


def leaders(servers: list[LiveServer]) -> list[LiveServer]:
    return [s for s in servers if s.process.poll() is None and is_leader(s)]


def the_leader(servers: list[LiveServer], timeout: float = 120.0) -> LiveServer:
    """The one leader among the live ``servers``, once there is exactly one."""
    wait_for("one leader", lambda: len(leaders(servers)) == 1, timeout=timeout)
    [leader] = leaders(servers)
    return leader


def kill_leader(leader: LiveServer) -> None:
    """kill -9: no shutdown, no released lock; the database notices the dead connection."""
    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(timeout=30)


def report(line: str) -> None:
    sys.stdout.write(line + "\n")  # what the test checked, for the run's log


def start(stack: ExitStack, url: str, tmp_path: Path, roles: list[str]) -> list[LiveServer]:
    """One ready server per role. All are started before any is waited for: each spends
    seconds of CPU on its imports, and those overlap where a core is free."""
    servers = [
        stack.enter_context(live_server(url, tmp_path, "--role", role, ready=False))
        for role in roles
    ]
    for server in servers:
        server.wait_ready()
    return servers


def push(server: LiveServer, token: str, batch: dict) -> None:
    with server.client(token) as client:
        response = client.post("/v1/ingest", json=batch)
        assert response.status_code == 200, response.text


class Fleet:
    """Counts, straight from the database, of what the leader did for the test's nodes."""

    def __init__(self, url: str) -> None:
        self.db = Database(make_engine(ServerSettings(database_url=url)))

    def evictions(self, node: str) -> int:
        with self.db.read() as conn:
            query = select(func.count()).select_from(evictions).where(evictions.c.node == node)
            return int(conn.execute(query).scalar_one())

    def alerts(self, node: str) -> list[tuple[str, str]]:
        """(kind, state) of every alert row of ``node``."""
        with self.db.read() as conn:
            rows = conn.execute(select(alerts.c.kind, alerts.c.state).where(alerts.c.node == node))
            return [(r.kind, r.state) for r in rows]

    def alert_keys(self, node: str) -> list[str]:
        """The dedup key of every alert row of ``node``: a condition alerted twice shows twice."""
        with self.db.read() as conn:
            query = select(alerts.c.dedup_key).where(alerts.c.node == node)
            return list(conn.execute(query).scalars())

    def slowness(self, nodes: list[str]) -> dict[str, tuple[int, float]]:
        """node -> (windows counted, score) of ``node_slowness``."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(node_slowness.c.node, node_slowness.c.windows, node_slowness.c.score).where(
                    node_slowness.c.node.in_(nodes)
                )
            )
            return {r.node: (int(r.windows), float(r.score)) for r in rows}

    @contextmanager
    def writes_held(self, table: str) -> Iterator[None]:
        """Hold every write to ``table`` (reads go on) until the block ends: a pass that writes
        it waits, inside its transaction, for as long as the test likes."""
        with self.db.engine.connect() as conn, conn.begin() as hold:
            conn.execute(text(f"LOCK TABLE {table} IN EXCLUSIVE MODE"))
            yield
            hold.rollback()

    def waiting_on(self, table: str) -> int:
        """Sessions waiting for a lock on ``table``."""
        query = text(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = CAST(:t AS regclass)"
        )
        with self.db.read() as conn:
            return int(conn.execute(query, {"t": table}).scalar_one())

    def dispose(self) -> None:
        self.db.dispose()
