"""The ``sim`` collector: one node of the simulated fleet, in real time or faster."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer

from fleetwatch.agent.collectors.base import Collection, Collector
from fleetwatch.agent.collectors.sim import SimCollector
from fleetwatch.config import AgentSettings
from fleetwatch.errors import ConfigError
from fleetwatch.sim import FleetSpec, SimFleet
from fleetwatch.sim.truth import parse_time
from fleetwatch.telemetry import Batch, IngestLimits, NodeInfo

SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


def _real(fleet: SimFleet, sim: datetime) -> datetime:
    """The real time at which ``fleet`` shows simulated time ``sim`` (before the cap binds)."""
    spec = fleet.spec
    return spec.real_start + (sim - spec.start) / spec.speed


def _as_batch(collector: SimCollector, collection: Collection, now: datetime) -> Batch:
    """What the agent would push, validated as the server validates it."""
    body = {
        "batch_id": "b-1",
        "node": NodeInfo(
            name=collector.node, labels=collector.labels, boot_id=collector.boot_id(now)
        ).model_dump(),
        "gpus": [gpu.model_dump() for gpu in collection.gpus],
        "samples": [sample.model_dump() for sample in collection.samples],
        "events": [event.model_dump() for event in collection.events],
        "ports": [port.model_dump() for port in collection.ports],
    }
    # A fast fleet replays its whole horizon of history: the server must be set to take it.
    history = timedelta(days=collector.fleet.spec.horizon_days + 1)
    limits = IngestLimits(now=now, max_past_age=history)
    return Batch.model_validate(body, context={"limits": limits})


def test_sim_collector_is_a_collector(spec: FleetSpec, fleet: SimFleet) -> None:
    collector: Collector = SimCollector(spec, fleet.node_names()[0], fleet=fleet)
    assert collector.name == "sim"
    collector.close()


def test_real_time_collector_stamps_the_real_time(make_spec: Callable[..., FleetSpec]) -> None:
    spec = make_spec(speed=1.0, nodes=2)
    collector = SimCollector(spec, "sim-node-001")
    now = spec.real_start + timedelta(days=3, seconds=7)
    collection = collector.collect(now)
    assert len(collection.samples) == len(collection.gpus) == spec.gpus_per_node
    assert {sample.ts for sample in collection.samples} == {now}
    assert [gpu.uuid for gpu in collection.gpus] == [s.uuid for s in collection.samples]
    assert _as_batch(collector, collection, now).samples


def test_fast_collector_runs_ahead_of_real_time_but_never_into_the_future(
    spec: FleetSpec, fleet: SimFleet
) -> None:
    collector = SimCollector(spec, fleet.node_names()[3], fleet=fleet)
    for real in (
        spec.real_start,
        spec.real_start + timedelta(hours=2),
        spec.real_start + timedelta(days=6),  # the whole horizon played at speed 60
        spec.real_start + timedelta(days=30),  # after it, sim time is capped at real time
    ):
        collection = collector.collect(real)
        expected = min(spec.start + (real - spec.real_start) * spec.speed, real)
        assert {sample.ts for sample in collection.samples} <= {expected}
        assert all(e.ts <= real for e in collection.events)
        assert collector.boot_id(real) == fleet.boot_id(collector.node, expected)
    hours = timedelta(hours=2)
    assert fleet.sim_time(spec.real_start + hours) == spec.start + hours * 60


def test_each_event_is_collected_once_and_none_is_lost(
    spec: FleetSpec, fleet: SimFleet, truth: dict[str, Any]
) -> None:
    node = truth["nodes"][0]["name"]
    collector = SimCollector(spec, node, fleet=fleet)
    first = spec.real_start + timedelta(minutes=1)
    collector.collect(first)  # starts at the end of the log
    real = first
    seen = []
    for _ in range(2000):  # 20 simulated days in 10-minute ticks
        real += timedelta(seconds=10)
        seen += collector.collect(real).events
    while fleet.is_silent(node, fleet.sim_time(real)):  # what a silence holds back comes after
        real += timedelta(seconds=10)
        seen += collector.collect(real).events
    assert seen == fleet.events(node, fleet.sim_time(first), fleet.sim_time(real))
    assert len(seen) > 10


def test_a_silent_node_sends_nothing(fleet: SimFleet, truth: dict[str, Any]) -> None:
    node, window = next(
        (n["name"], w)
        for n in truth["nodes"]
        for w in n["silent_windows"]
        if w["reason"] == "outage"
    )
    start, end = parse_time(window["start"]), parse_time(window["end"])
    collector = SimCollector(fleet.spec, node, fleet=fleet)
    collector.collect(_real(fleet, start - timedelta(minutes=30)))
    during = collector.collect(_real(fleet, start + (end - start) / 2))
    quiet = collector.collect(_real(fleet, start + (end - start) * 0.75))
    assert during.samples == [] and during.gpus == [] and during.ports == []
    assert quiet == Collection()
    assert collector.collect(_real(fleet, end + SECOND)).samples


def test_the_fatal_xid_of_a_node_that_hangs_still_gets_out(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    gpu = next(g for g in truth["gpus"] if g["node_silent_until"] is not None)
    node, at = gpu["node"], parse_time(gpu["failure_time"])
    collector = SimCollector(fleet.spec, node, fleet=fleet)
    collector.collect(_real(fleet, at - timedelta(minutes=5)))
    hung = collector.collect(_real(fleet, at + timedelta(minutes=5)))
    assert hung.samples == []
    assert any(e.xid == gpu["cause_xid"] and e.uuid == gpu["uuid"] for e in hung.events)
    back = collector.collect(_real(fleet, parse_time(gpu["node_silent_until"]) + SECOND))
    assert gpu["uuid"] not in {s.uuid for s in back.samples}
    assert gpu["uuid"] not in {g.uuid for g in back.gpus}
    assert all(e.uuid != gpu["uuid"] for e in back.events)


def test_collections_validate_as_batches(spec: FleetSpec, fleet: SimFleet) -> None:
    node = fleet.node_names()[5]
    collector = SimCollector(spec, node, fleet=fleet)
    real = spec.real_start + timedelta(hours=1)
    collector.collect(real)
    ports = 0
    for _ in range(50):
        real += timedelta(minutes=10)  # ~7 simulated hours a tick
        ports += len(_as_batch(collector, collector.collect(real), real).ports or ())
    assert ports >= 8 * 40  # 8 ports a collection, but while the node is silent


def test_from_settings(spec: FleetSpec, tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    spec.save(path)
    settings = AgentSettings(sim_spec=path, node_name="sim-node-002", collectors=["sim"])
    collector = SimCollector.from_settings(settings)
    assert collector.node == "sim-node-002"
    assert SimCollector.from_spec_file(path, "sim-node-001").node == "sim-node-001"
    assert collector.labels == {"cluster": "sim", "row": "0", "rack": "r000", "position": "2"}


@pytest.mark.parametrize(
    ("sim_spec", "node", "problem"),
    [
        (None, "sim-node-000", "needs sim_spec"),
        ("missing.json", "sim-node-000", "cannot read"),
        ("garbage.json", "sim-node-000", "not a fleet spec"),
        ("fleet.json", "gpu-node-017", "not in the simulated fleet"),
    ],
)
def test_from_settings_says_what_is_wrong(
    spec: FleetSpec, tmp_path: Path, sim_spec: str | None, node: str, problem: str
) -> None:
    spec.save(tmp_path / "fleet.json")
    (tmp_path / "garbage.json").write_text("{}")
    settings = AgentSettings(
        sim_spec=tmp_path / sim_spec if sim_spec else None, node_name=node, collectors=["sim"]
    )
    with pytest.raises(ConfigError, match=problem):
        SimCollector.from_settings(settings)


def _ingest_body(collector: SimCollector, collection: Collection, now: datetime) -> str:
    node = NodeInfo(name=collector.node, labels=collector.labels, boot_id=collector.boot_id(now))
    body = {
        "batch_id": f"sim-{now.timestamp():.0f}",
        "node": node.model_dump(mode="json", exclude_none=True),
        "gpus": [g.model_dump(mode="json", exclude_none=True) for g in collection.gpus],
        "samples": [s.model_dump(mode="json", exclude_none=True) for s in collection.samples],
        "events": [e.model_dump(mode="json", exclude_none=True) for e in collection.events],
        "ports": [p.model_dump(mode="json", exclude_none=True) for p in collection.ports],
    }
    return json.dumps(body)


def test_simulated_ports_reach_the_server(client: TestClient, tokens: dict[str, str]) -> None:
    # The server takes only recent readings; the fleet's story is the same whatever its start.
    now = datetime.now(UTC).replace(microsecond=0)
    spec = FleetSpec.live(seed=1, real_start=now - 2 * HOUR, speed=1.0, nodes=6)
    fleet = SimFleet(spec)
    first, second = now - HOUR, now - HOUR + 10 * SECOND
    # A node that is heard and busy: its ports carry traffic between the two readings.
    node = next(
        n
        for n in fleet.node_names()
        if not fleet.is_silent(n, first) and not fleet.is_silent(n, second)
        and fleet.sample(n, second)[0].gpu_util_pct
    )  # fmt: skip
    collector = SimCollector(spec, node, fleet=fleet)
    sent = []
    for at in (first, second):
        collection = collector.collect(at)
        assert len(collection.ports) == spec.network.ports_per_node
        sent.append(collection.ports)
        posted = client.post(
            "/v1/ingest",
            content=_ingest_body(collector, collection, at),
            headers={"Content-Type": "application/json", **bearer(tokens["agent"])},
        )
        assert posted.status_code == 200, posted.text

    shown = client.get(f"/v1/nodes/{node}/ports", headers=bearer(tokens["read"]))
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["count"] == 8
    ports = {p["device"]: p for p in body["data"]}
    for port in sent[1]:
        stored = ports[port.device]
        assert stored["counters"] == port.counters and stored["hw_counters"] == port.hw_counters
        assert (stored["link_layer"], stored["state"]) == (port.link_layer, port.state)
        assert stored["rate_gbps"] == port.rate_gbps
        before = next(p for p in sent[0] if p.device == port.device)
        assert before.counters is not None and port.counters is not None
        words = port.counters["port_xmit_data"] - before.counters["port_xmit_data"]
        assert stored["rates"]["counters"]["port_xmit_data"]["per_s"] == pytest.approx(words / 10)
        assert words > 0 or port.state != "ACTIVE"
