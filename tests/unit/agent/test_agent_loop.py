"""The agent end to end in-process: collectors -> spool -> pusher -> the real app (TestClient)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from fastapi.testclient import TestClient

from fleetwatch.agent.collectors.base import Collection, readings_to_collection
from fleetwatch.agent.collectors.kernel_log import KernelLogCollector
from fleetwatch.agent.kmsg import open_kernel_log
from fleetwatch.agent.loop import Agent, build_batch
from fleetwatch.agent.parsers import GpuReading
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import SetAside, Spool
from fleetwatch.config import ServerSettings
from fleetwatch.errors import CollectorError
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample, MigIdentity, NodeInfo

UUID = "GPU-00000000-1111-2222-3333-444444444444"


class StaticCollector:
    name: ClassVar[str] = "static"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self, now: datetime) -> Collection:
        self.calls += 1
        return Collection(
            gpus=[GpuIdentity(uuid=UUID, index=0, pci_bus_id="0000:3b:00.0")],
            samples=[GpuSample(uuid=UUID, ts=now, gpu_temp_c=50.0 + self.calls)],
        )

    def close(self) -> None:
        pass


class BrokenCollector:
    name: ClassVar[str] = "broken"

    def collect(self, now: datetime) -> Collection:
        raise CollectorError("device went away")

    def close(self) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[TestClient, str, str]]:
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 's.db'}"))
    with TestClient(app) as client:
        with app.state.db.write() as conn:
            agent_token, _ = create_token(conn, name="a", scope="agent")
            read_token, _ = create_token(conn, name="r", scope="read")
        yield client, agent_token, read_token


def _agent(tmp_path: Path, client: TestClient, token: str, collectors: list[object]) -> Agent:
    client.headers["Authorization"] = f"Bearer {token}"
    spool = Spool(tmp_path / "spool")
    metrics = AgentMetrics()
    pusher = Pusher(client, spool, metrics, rejected_dir=tmp_path / "rejected")
    return Agent(
        node=NodeInfo(name="node-1", interval_s=0.2, boot_id="b1"),
        collectors=collectors,  # type: ignore[arg-type]
        spool=spool,
        pusher=pusher,
        metrics=metrics,
        clock=lambda: datetime.now(UTC),
    )


def test_agent_pushes_samples_and_survives_a_failing_collector(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, read_token = server
    static = StaticCollector()
    agent = _agent(tmp_path, client, agent_token, [BrokenCollector(), static])
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    _until(lambda: static.calls >= 4)  # three full cycles done, the fourth under way
    stop.set()
    runner.join(timeout=10)
    auth = {"Authorization": f"Bearer {read_token}"}
    samples = client.get(f"/v1/gpus/{UUID}/samples", headers=auth).json()
    assert samples["count"] >= 3
    temps = [p["values"]["gpu_temp_c"] for p in samples["data"]]
    assert temps == sorted(temps)  # in order, none repeated
    assert len(set(temps)) == len(temps)
    assert agent.spool_depth() == (0, 0)
    errors = agent._metrics.collector_errors.labels("broken", "CollectorError")._value.get()
    assert errors >= 3


def test_agent_pushes_a_kernel_xid_line_before_the_next_tick(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, read_token = server
    log = tmp_path / "kern.log"
    log.write_text("")
    kernel = KernelLogCollector(
        open_kernel_log(str(log), tmp_path / "state"), clock=lambda: datetime.now(UTC), poll_s=0.05
    )
    static = StaticCollector()
    agent = _agent(tmp_path, client, agent_token, [static, kernel])
    # Ticks an hour apart: an Xid that reaches the server while the collector has run only once
    # was pushed by the watcher the moment it was read, not carried by the next tick.
    agent.node = NodeInfo(name="node-1", interval_s=3600, boot_id="b1")
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    auth = {"Authorization": f"Bearer {read_token}"}
    try:
        _until(lambda: client.get(f"/v1/gpus/{UUID}", headers=auth).status_code == 200)
        with log.open("a") as f:
            f.write(
                "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, "
                "GPU has fallen off the bus.\n"
            )
        found: list[dict[str, object]] = []

        def xid_stored() -> bool:
            found[:] = client.get("/v1/events", params={"xid": 79}, headers=auth).json()["data"]
            return bool(found)

        _until(xid_stored)
    finally:
        stop.set()
        runner.join(timeout=60)
    assert static.calls == 1
    event = found[0]
    assert (event["gpu_uuid"], event["pid"], event["process"]) == (UUID, 4242, "python3")
    assert event["pci_bus_id"] == "0000:3b:00.0"


def test_agent_tells_the_server_what_a_full_spool_dropped(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, read_token = server
    agent = _agent(tmp_path, client, agent_token, [StaticCollector()])
    agent._spool.max_bytes = 1  # every new batch pushes the previous one out
    # The server is unreachable: batches pile up in the spool and overflow it.
    agent._pusher._client = httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(503)), base_url="http://x"
    )
    for _ in range(4):
        agent.spool_collection(agent.collect())
    assert agent._spool.counter("dropped_batches") >= 3
    # The connection returns (and the disk has room): the next batch carries a spool_dropped
    # event with the counts.
    agent._pusher._client = client
    agent._spool.max_bytes = 512 * 1024 * 1024
    agent.spool_collection(agent.collect())
    agent.drain_once()
    auth = {"Authorization": f"Bearer {read_token}"}
    (event,) = client.get("/v1/events", params={"kind": "spool_dropped"}, headers=auth).json()[
        "data"
    ]
    assert event["details"]["batches"] >= 3 and event["details"]["samples"] >= 3
    assert event["node"] == "node-1"


def test_agent_tells_the_server_of_a_set_aside_batch(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, read_token = server
    agent = _agent(tmp_path, client, agent_token, [StaticCollector()])
    agent._spool.put("poisoned-batch", b"P", samples=1, events=2)
    poisoned = agent._spool.next()
    assert poisoned is not None
    agent._spool.set_aside(
        poisoned.seq,
        SetAside("poisoned-batch", time.time(), 500, 7, 612.5, 1, 2, '{"error":"internal"}'),
    )
    agent.spool_collection(agent.collect())
    agent.drain_once()
    auth = {"Authorization": f"Bearer {read_token}"}
    (event,) = client.get("/v1/events", params={"kind": "batch_set_aside"}, headers=auth).json()[
        "data"
    ]
    assert event["node"] == "node-1"
    assert event["details"]["batch_id"] == "poisoned-batch"
    assert (event["details"]["status"], event["details"]["attempts"]) == (500, 7)
    assert (event["details"]["samples"], event["details"]["events"]) == (1, 2)
    assert "set aside batch poisoned-batch" in event["message"]
    # Reported once: the acknowledged batch took the report with it.
    assert agent._spool.take_set_aside_reports("later") == []


def test_agent_cleans_control_characters_from_collected_text() -> None:
    # A NUL from a source is cleaned before the wire objects are built (they refuse one); the
    # other control characters, which the wire accepts, are cleaned once more in build_batch.
    reading = GpuReading(identity={"uuid": UUID, "index": 0, "name": "NVIDIA\x00H100\x1b[0m"})
    collection = readings_to_collection([reading], datetime.now(UTC))
    # Nested text too: a MIG profile from a collector that did not clean it.
    mig = {"current": "enabled", "instances": [{"gpu_instance_id": 1, "profile": "1g.5gb\x1b"}]}
    collection.gpus[0] = collection.gpus[0].model_copy(update={"mig": MigIdentity(**mig)})
    collection.events.append(
        Event(
            kind="xid",
            ts=datetime.now(UTC),
            xid=79,
            process="py\x07",
            details={"label\x01": ["a\x7fb"]},
        )
    )
    batch = build_batch(
        NodeInfo(name="node-1", labels={"rack": "r\x1b12"}, boot_id="b1"), collection
    )
    assert batch.gpus[0].name == "NVIDIA\ufffdH100\ufffd[0m"
    assert batch.gpus[0].mig is not None
    assert batch.gpus[0].mig.instances[0].profile == "1g.5gb\ufffd"
    assert batch.events[0].process == "py\ufffd"
    assert batch.events[0].details == {"label\ufffd": ["a\ufffdb"]}
    assert batch.node.labels == {"rack": "r\ufffd12"}
    assert "\\u0000" not in batch.model_dump_json()


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for ``condition`` with a limit generous enough for a loaded CI machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
