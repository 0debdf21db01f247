"""Several collections per push, end to end in-process: agent -> spool -> pusher -> the real app.

The agent's clock is injected and cycles are driven one by one (``Agent.cycle``), so nothing waits
on real time; rows are counted in the server's database, where "exactly once" is decided.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.stored_samples import stored_samples

from fleetwatch.agent import loop
from fleetwatch.agent.collectors.base import Collection
from fleetwatch.agent.loop import Agent
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.server.concepts.liveness import node_state
from fleetwatch.server.db.tables import events, nodes
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample, NodeInfo

GPUS = 8


def _uuid(i: int) -> str:
    return f"GPU-5e1d2c3b-4a59-6877-8695-{i:012d}"


class Clock:
    def __init__(self) -> None:
        # An hour ago: every reading is within the server's clock-skew and age limits.
        self.now = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class EightGpus:
    """Eight GPUs with a dozen fields each, and whatever events a test hands it."""

    name: ClassVar[str] = "eight"

    def __init__(self) -> None:
        self.calls = 0
        self.pending: list[Event] = []

    def collect(self, now: datetime) -> Collection:
        self.calls += 1
        out = Collection(events=self.pending)
        self.pending = []
        for i in range(GPUS):
            out.gpus.append(
                GpuIdentity(uuid=_uuid(i), index=i, pci_bus_id=f"0000:{i + 16:02x}:00.0")
            )
            out.samples.append(
                GpuSample(
                    uuid=_uuid(i),
                    ts=now,
                    gpu_temp_c=40.0 + i + self.calls % 3,
                    power_w=300.0 + self.calls,
                    gpu_util_pct=99.0,
                    fb_used_mib=61_000.0,
                    energy_mj=1_000_000 * self.calls + i,
                    ecc_sbe_volatile_total=0,
                    ecc_dbe_volatile_total=0,
                    remapped_rows_pending=False,
                    pcie_replay_total=0,
                )
            )
        return out

    def close(self) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[TestClient, FastAPI, list[httpx.Request]]]:
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 's.db'}"))
    requests: list[httpx.Request] = []
    with TestClient(app) as client:
        with app.state.db.write() as conn:
            token, _ = create_token(conn, name="a", scope="agent")
        client.headers["Authorization"] = f"Bearer {token}"
        client.event_hooks["request"] = [requests.append]
        yield client, app, requests


def _agent(
    spool_dir: Path,
    client: httpx.Client,
    clock: Clock,
    collector: EightGpus,
    *,
    push_interval_s: float = 60.0,
    interval_s: float = 10.0,
) -> Agent:
    spool = Spool(spool_dir)
    metrics = AgentMetrics()
    pusher = Pusher(client, spool, metrics, rejected_dir=spool_dir / "rejected")
    return Agent(
        node=NodeInfo(name="node-1", interval_s=interval_s, boot_id="b1"),
        collectors=[collector],  # type: ignore[list-item]
        spool=spool,
        pusher=pusher,
        metrics=metrics,
        clock=clock,
        push_interval_s=push_interval_s,
    )


def _cycles(agent: Agent, clock: Clock, n: int) -> None:
    for _ in range(n):
        agent.cycle()
        clock.advance(agent.node.interval_s)


def _stored(app: FastAPI) -> list[tuple[str, datetime]]:
    with app.state.db.engine.connect() as conn:
        return [(s["gpu_uuid"], s["ts"]) for s in stored_samples(conn)]


def _ingests(requests: list[httpx.Request]) -> int:
    return sum(1 for r in requests if r.url.path == "/v1/ingest")


def _spooled(spool: Spool) -> list[dict[str, Any]]:
    out, skip = [], 0
    while (batch := spool.next(skip)) is not None:
        out.append({"critical": batch.critical, **json.loads(gzip.decompress(batch.body))})
        skip += 1
    return out


def test_agent_pushes_six_collections_of_eight_gpus_as_one_batch_of_48_rows(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, requests = server
    clock = Clock()
    agent = _agent(tmp_path / "spool", client, clock, EightGpus())
    _cycles(agent, clock, 5)
    assert agent._spool.staged()[0] == 5
    assert agent.spool_depth() == (0, 0)  # nothing to push yet
    assert agent._metrics.staged_ticks._value.get() == 5
    _cycles(agent, clock, 1)
    assert agent._spool.staged() == (0, None)
    (batch,) = _spooled(agent._spool)
    assert len(batch["samples"]) == 48 and len(batch["gpus"]) == GPUS
    assert (batch["node"]["interval_s"], batch["node"]["push_interval_s"]) == (10.0, 60.0)
    agent.drain_once()
    assert _ingests(requests) == 1
    stored = _stored(app)
    assert len(stored) == 48 == len(set(stored))
    assert len({ts for _, ts in stored}) == 6
    assert agent._metrics.staged_ticks._value.get() == 0
    # The server judges the node's silence by its push interval: 45 s after this push (longer
    # than three collection intervals) it is still up.
    with app.state.db.engine.connect() as conn:
        node = conn.execute(select(nodes.c.interval_s, nodes.c.last_seen)).one()
    assert node.interval_s == 60.0
    later = node.last_seen + timedelta(seconds=45)
    assert node_state(node.last_seen, node.interval_s, 3.0, later) == "up"


def test_agent_pushes_a_critical_xid_at_once_while_collections_stay_staged(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, requests = server
    clock = Clock()
    source = EightGpus()
    agent = _agent(tmp_path / "spool", client, clock, source)
    _cycles(agent, clock, 1)
    source.pending = [
        Event(kind="xid", xid=79, uuid=_uuid(3), ts=clock(), message="fallen off the bus"),
        Event(kind="nvml", uuid=_uuid(3), ts=clock(), message="clock change"),
    ]
    _cycles(agent, clock, 1)
    (critical,) = _spooled(agent._spool)
    assert critical["critical"] and [e["kind"] for e in critical["events"]] == ["xid"]
    assert critical["samples"] == []
    assert agent._spool.staged()[0] == 2
    agent.drain_once()
    with app.state.db.engine.connect() as conn:
        kinds = conn.execute(select(events.c.kind, events.c.xid)).all()
    assert [(k.kind, k.xid) for k in kinds] == [("xid", 79)]
    assert _stored(app) == []  # the readings wait for their push
    _cycles(agent, clock, 4)
    agent.drain_once()
    assert _ingests(requests) == 2
    assert len(set(_stored(app))) == len(_stored(app)) == 48
    with app.state.db.engine.connect() as conn:
        kinds = conn.execute(select(events.c.kind)).scalars().all()
    assert sorted(kinds) == ["nvml", "xid"]  # the routine event rode with its collection


def test_agent_killed_between_collections_loses_none_and_stores_each_once(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, requests = server
    clock = Clock()
    first = _agent(tmp_path / "spool", client, clock, EightGpus())
    _cycles(first, clock, 3)
    first._spool.close()  # killed: no shutdown, no push; three collections are staged
    second = _agent(tmp_path / "spool", client, clock, EightGpus())
    assert second._spool.staged()[0] == 3
    _cycles(second, clock, 3)
    second.drain_once()
    stored = _stored(app)
    assert len(stored) == 48 == len(set(stored))
    assert _ingests(requests) == 1


def test_agent_crashing_while_it_combines_loses_nothing_and_duplicates_nothing(
    tmp_path: Path,
    server: tuple[TestClient, FastAPI, list[httpx.Request]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, app, _ = server
    clock = Clock()
    first = _agent(tmp_path / "spool", client, clock, EightGpus())
    real_combine = loop.combine_ticks

    def dies_midway(*args: Any, **kwargs: Any) -> Any:
        real_combine(*args, **kwargs)
        raise SystemExit(137)  # the batch is built but the transaction never commits

    monkeypatch.setattr(loop, "combine_ticks", dies_midway)
    with pytest.raises(SystemExit):
        _cycles(first, clock, 6)
    first._spool.close()
    monkeypatch.undo()
    second = _agent(tmp_path / "spool", client, clock, EightGpus())
    assert (second._spool.staged()[0], second.spool_depth()[0]) == (6, 0)
    second.push_staged()
    # Killed again after the combine committed, before any push: the batch is replayed.
    second._spool.close()
    third = _agent(tmp_path / "spool", client, clock, EightGpus())
    assert (third._spool.staged()[0], third.spool_depth()[0]) == (0, 1)
    third.drain_once()
    stored = _stored(app)
    assert len(stored) == 48 == len(set(stored))


def test_agent_replays_byte_identical_batches_after_an_outage_and_each_row_is_stored_once(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, _ = server
    sent: list[tuple[str, bytes]] = []
    down = True

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((json.loads(gzip.decompress(request.content))["batch_id"], request.content))
        if down:
            return httpx.Response(503)
        answer = client.post(
            "/v1/ingest",
            content=request.content,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        return httpx.Response(answer.status_code, content=answer.content)

    flaky = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://server")
    clock = Clock()
    source = EightGpus()
    agent = _agent(tmp_path / "spool", flaky, clock, source)
    for _ in range(12):
        _cycles(agent, clock, 1)
        agent.drain_once()  # fails at the first batch, as the pusher thread would
    source.pending = [Event(kind="xid", xid=48, uuid=_uuid(0), ts=clock())]
    _cycles(agent, clock, 1)
    agent.drain_once()
    assert agent.spool_depth()[0] == 3  # two pushes of six collections, one critical batch
    down = False
    agent.drain_once()
    assert agent.spool_depth() == (0, 0)
    bodies: dict[str, set[bytes]] = {}
    for batch_id, body in sent:
        bodies.setdefault(batch_id, set()).add(body)
    assert len(bodies) == 3
    assert all(len(versions) == 1 for versions in bodies.values())  # byte-identical replays
    first_after = sent[len(sent) - 3][1]
    assert json.loads(gzip.decompress(first_after))["events"][0]["xid"] == 48  # critical first
    stored = _stored(app)
    assert len(stored) == 96 == len(set(stored))
    # A replay of a stored multi-collection batch stores nothing new.
    replay = client.post(
        "/v1/ingest",
        content=sent[-1][1],
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert replay.status_code == 200 and replay.json()["duplicate"] is True
    assert len(_stored(app)) == 96


def test_agent_on_shutdown_pushes_what_is_staged(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, _ = server
    source = EightGpus()
    # An hour between collections: the one collection made before the stop is pushed by the
    # shutdown, not by a push interval running out.
    agent = _agent(
        tmp_path / "spool", client, Clock(), source, interval_s=3600, push_interval_s=7200
    )
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    _until(lambda: agent._spool.staged()[0] == 1)
    stop.set()
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert source.calls == 1
    assert len(_stored(app)) == GPUS
    assert agent._spool.staged()[0] == 0 and agent.spool_depth() == (0, 0)


def test_agent_with_push_interval_zero_pushes_every_collection_as_before(
    tmp_path: Path, server: tuple[TestClient, FastAPI, list[httpx.Request]]
) -> None:
    client, app, requests = server
    clock = Clock()
    agent = _agent(tmp_path / "spool", client, clock, EightGpus(), push_interval_s=0)
    for _ in range(3):
        _cycles(agent, clock, 1)
        (batch,) = _spooled(agent._spool)
        assert len(batch["samples"]) == GPUS
        assert "push_interval_s" not in batch["node"]  # the bytes an older server takes
        agent.drain_once()
    assert _ingests(requests) == 3
    assert agent._spool.staged() == (0, None)
    assert len(set(_stored(app))) == 24


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for ``condition`` with a limit generous enough for a loaded CI machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
