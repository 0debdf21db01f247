"""Real agents keep running while the real server is down: every sample arrives once.

Agents are `fleetwatch agent` processes reading a real nvidia-smi XML capture (no GPU here); the
server is a `fleetwatch server` process, stopped and restarted on the same port and database.
They collect every 0.5 s and push every collection (down until each spool holds six batches), or
stage three collections per push (``--push-interval 1.5``, down for 9 s: six pushes' worth;
twice that at a 1 s interval was most of the test's time): then the batches replayed
after the outage hold several collections each, and the collections still staged when the agents
stop are pushed by their shutdown.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.live import (
    create_token,
    free_port,
    live_server,
    start_agent,
    stop_agents,
)

SPOOLED = 6  # batches each spool holds before the server comes back
INTERVAL_S = 0.5
OUTAGE_S = 9  # SPOOLED pushes of 1.5 s
# One real capture per node: each holds one GPU of its own.
CAPTURES = (
    "fixtures/nvidia_smi/xml/telegraf__a100-sxm4-v12.xml",
    "fixtures/nvidia_smi/xml/telegraf__a10g.xml",
    "fixtures/nvidia_smi/xml/telegraf__tesla-t4.xml",
)


def _cycles(log: str, push_interval_s: float) -> int:
    """Collections made, from the agent's one line per collection (not its lines per push)."""
    word = "staged" if push_interval_s else "spooled"
    line = re.compile(rf" {word} \d+ samples, \d+ events for \d+ GPUs")
    return sum(1 for text in log.splitlines() if line.search(text))


@pytest.mark.slow
# Pairwise, not every combination: each store once, each push mode once. The push mode lives in
# the agent and the store behind the server's one ingest path; the four combinations cost 2 min
# of a loaded suite and caught nothing the two did not.
@pytest.mark.parametrize(
    ("database_url", "push_interval_s"),
    [
        pytest.param("sqlite", 0.0, id="sqlite-each-collection"),
        pytest.param(
            "postgresql", 3 * INTERVAL_S, id="postgresql-staged", marks=pytest.mark.postgres
        ),
    ],
    indirect=["database_url"],
)
def test_agents_lose_nothing_and_duplicate_nothing_across_a_server_outage(
    database_url: str, tmp_path: Path, shared_dir: Path, push_interval_s: float
) -> None:
    agent_token, read_token = (
        create_token(database_url, "agent"),
        create_token(database_url, "read"),
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agents = []
    with live_server(database_url, tmp_path, port=port) as server:
        agents = [
            start_agent(
                f"node-{i}",
                url,
                agent_token,
                tmp_path,
                "--collectors",
                "nvidia-smi",
                "--nvidia-smi",
                str(shared_dir / capture),
                interval_s=INTERVAL_S,
                push_interval_s=push_interval_s,
            )
            for i, capture in enumerate(CAPTURES)
        ]
        # Every agent reaches the server before it goes down (counted, not timed).
        deadline = time.monotonic() + 120
        pushed: list[float | None] = []
        while time.monotonic() < deadline:
            pushed = [a.metric("fleetwatch_agent_pushed_batches_total") for a in agents]
            if all(p is not None and p >= 1 for p in pushed):
                break
            time.sleep(0.2)
        assert all(p is not None and p >= 1 for p in pushed), pushed
    # The server is down now; agents keep collecting into their spools. Counted, not timed:
    # wait (generously) until every spool holds SPOOLED batches, then stay down the rest of the
    # outage.
    down = time.monotonic()
    waiting: list[float | None] = []
    while time.monotonic() < down + 180:
        waiting = [a.metric("fleetwatch_agent_spool_batches") for a in agents]
        if all(w is not None and w >= SPOOLED for w in waiting):
            break
        time.sleep(0.5)
    assert all(w is not None and w >= SPOOLED for w in waiting), waiting
    if push_interval_s:
        # Staging agents (the default) also stay down for OUTAGE_S: collections staged, pushed,
        # refused and spooled again six times over. Agents pushing every collection have shown
        # what they must with their six spooled batches, and the suite spares the wait.
        time.sleep(max(0.0, down + OUTAGE_S - time.monotonic()))
    with live_server(database_url, tmp_path, port=port) as server:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if all(a.metric("fleetwatch_agent_spool_batches") == 0 for a in agents):
                break
            time.sleep(0.5)
        logs = stop_agents(agents)
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {read_token}"}
        ) as read:
            for agent in agents:
                node = read.get(f"/v1/nodes/{agent.name}").json()
                (gpu,) = node["gpus"]
                samples = read.get(
                    f"/v1/gpus/{gpu['uuid']}/samples", params={"limit": 100000}
                ).json()
                stamps = [p["ts"] for p in samples["data"]]
                cycles = _cycles(logs[agent.name], push_interval_s)
                assert cycles >= SPOOLED, f"{agent.name} ran only {cycles} cycles"
                assert len(stamps) == len(set(stamps)), "a sample arrived twice"
                assert len(stamps) == cycles, f"{agent.name}: {len(stamps)} stored of {cycles}"
                if push_interval_s:
                    assert node["interval_s"] == push_interval_s  # judged by its pushes
    for agent in agents:
        left = (
            sqlite3.connect(agent.spool_dir / "spool.db")
            .execute("SELECT (SELECT COUNT(*) FROM batches) + (SELECT COUNT(*) FROM staged)")
            .fetchone()[0]
        )
        assert left == 0


@pytest.mark.slow
def test_agent_killed_between_collections_pushes_them_after_its_restart(
    tmp_path: Path, shared_dir: Path
) -> None:
    """SIGKILL while collections are staged for a push a minute away: the next start pushes
    them, each stored once."""
    database_url = f"sqlite:///{tmp_path / 'fleetwatch.db'}"
    agent_token, read_token = (
        create_token(database_url, "agent"),
        create_token(database_url, "read"),
    )
    args = ("--collectors", "nvidia-smi", "--nvidia-smi", str(shared_dir / CAPTURES[0]))
    with live_server(database_url, tmp_path) as server:
        agent = start_agent("node-k", server.url, agent_token, tmp_path, *args,
                            interval_s=0.2, push_interval_s=60)  # fmt: skip
        spool_db = agent.spool_dir / "spool.db"

        def staged() -> int:
            if not spool_db.exists():
                return 0
            db = sqlite3.connect(spool_db)
            try:
                return int(db.execute("SELECT COUNT(*) FROM staged").fetchone()[0])
            except sqlite3.OperationalError:
                return 0  # the agent has not made its tables yet
            finally:
                db.close()

        deadline = time.monotonic() + 120
        while staged() < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        agent.process.kill()
        agent.process.wait()
        kept = staged()
        assert kept >= 5
        restarted = start_agent("node-k", server.url, agent_token, tmp_path, *args,
                                interval_s=0.2, push_interval_s=0)  # fmt: skip
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {read_token}"}
        ) as read:

            def stamps() -> list[str]:
                found = read.get("/v1/gpus", params={"node": "node-k"}).json()
                if not found:
                    return []
                samples = read.get(
                    f"/v1/gpus/{found[0]['uuid']}/samples", params={"limit": 100000}
                ).json()
                return [p["ts"] for p in samples["data"]]

            deadline = time.monotonic() + 120
            while len(stamps()) < kept + 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            log = restarted.stop()
            stored = stamps()
    assert staged() == 0
    assert len(stored) == len(set(stored)), "a sample arrived twice"
    assert len(stored) == kept + _cycles(log, 0), f"{len(stored)} stored of {kept} + restart"
