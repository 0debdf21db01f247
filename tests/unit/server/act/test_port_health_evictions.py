"""Network port health from ingest to events, verdicts, alerts and GET /v1/evictions, both
databases (issue 13): the agent sends port readings only; the server derives the port events
(rules.port_events), judges them (rules.port_health) and plans. Assessment, alerting and planning
are driven by hand, as in test_host_error_evictions; the urgent wake-up is checked on the route.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.unit.agent.sysfs_trees import h100_tree
from tests.unit.server.conftest import Push

from fleetwatch.agent.collectors.infiniband import InfinibandCollector
from fleetwatch.server.routers import urgent_lane

SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "fixtures"

DOWN = {"state": "DOWN", "state_code": 1, "phys_state": "Polling", "phys_state_code": 2}


def _port(ts: datetime, *, link_downed: int = 7, symbol_error: int = 2, **fields: Any) -> dict:
    return {
        "device": "mlx5_0",
        "port": 1,
        "ts": ts.isoformat(),
        "link_layer": "InfiniBand",
        "netdev": "ib0",
        "state": "ACTIVE",
        "state_code": 4,
        "phys_state": "LinkUp",
        "phys_state_code": 5,
        "rate_gbps": 400.0,
        "link_width": 4,
        "link_speed": "NDR",
        "counters": {"symbol_error": symbol_error, "link_downed": link_downed},
    } | fields


def _push_readings(push: Push, node: str, readings: list[dict[str, Any]]) -> list[int]:
    """One batch per reading, 10 s apart, ending now; the status of each push."""
    start = datetime.now(UTC) - timedelta(seconds=10 * len(readings))
    codes = []
    for i, fields in enumerate(readings):
        ts = start + timedelta(seconds=10 * i)
        batch = make_batch(node, gpus=2, ticks=1, start=ts)
        batch["ports"] = [_port(ts, **fields)]
        codes.append(push(batch).status_code)
    return codes


SCENARIOS: dict[str, tuple[list[dict[str, Any]], str, str, bool]] = {
    # name: readings, the event kind, the rule, whether it drains the node
    "link_down": ([{}, {}, DOWN], "port_down", "port_down", True),
    "flapping": (
        [{"link_downed": n} for n in (7, 8, 9, 10)],
        "port_flap",
        "port_flap",
        True,
    ),
    "rate_halved": ([{}, {}, {"rate_gbps": 200.0, "link_width": 2}], "port_degraded",
                    "port_degraded", False),
    "symbol_errors": (
        [{"symbol_error": n} for n in (2, 60, 130)],
        "port_errors",
        "port_errors",
        False,
    ),
}  # fmt: skip


def _read(client: TestClient, tokens: dict[str, str], path: str) -> Any:
    response = client.get(path, headers=bearer(tokens["read"]))
    assert response.status_code == 200, response.text
    return response.json()


def _evictions(client: TestClient, tokens: dict[str, str]) -> list[dict[str, Any]]:
    response = client.get("/v1/evictions", headers=bearer(tokens["scheduler"]))
    assert response.status_code == 200
    data: list[dict[str, Any]] = response.json()["data"]
    return data


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_port_reading_sequence_yields_event_verdict_alert_and_eviction_where_it_should(
    client: TestClient, push: Push, tokens: dict[str, str], name: str
) -> None:
    readings, kind, rule, drains = SCENARIOS[name]
    assert set(_push_readings(push, "node-n", readings)) == {200}
    assert _push_readings(push, "node-ok", [{}] * len(readings)) == [200] * len(readings)

    port_events = [
        e for e in _read(client, tokens, "/v1/events?node=node-n")["data"]
        if e["kind"].startswith("port_")
    ]  # fmt: skip
    assert kind in {e["kind"] for e in port_events}
    event = next(e for e in port_events if e["kind"] == kind)
    assert (event["details"]["device"], event["details"]["netdev"]) == ("mlx5_0", "ib0")

    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    risk = _read(client, tokens, f"/v1/gpus/{gpu_uuid('node-n', 0)}/risk")
    [verdict] = [v for v in risk["verdicts"] if v["rule"] == rule]
    assert verdict["kind"] == "host" and verdict["evidence"]["component"] == "network"
    assert verdict["evidence"]["port_key"] == "mlx5_0/1"
    assert verdict["takes_gpu_out"] is drains
    # The healthy node: no port event, no verdict.
    assert not [e for e in _read(client, tokens, "/v1/events?node=node-ok")["data"]
                if e["kind"].startswith("port_")]  # fmt: skip
    assert _read(client, tokens, f"/v1/gpus/{gpu_uuid('node-ok', 0)}/risk")["verdicts"] == []

    # One node alert for the node's port, whatever the number of its GPUs.
    assert state.alerter.run_once().fired == 1
    [alert] = _read(client, tokens, "/v1/alerts?state=firing")["data"]
    assert (alert["node"], alert["evidence"]["rule"]) == ("node-n", rule)
    assert alert["severity"] == ("critical" if drains else "warning")

    state.planner.run_once()
    evictions = _evictions(client, tokens)
    if not drains:
        assert evictions == []
        return
    [eviction] = evictions
    assert (eviction["node"], eviction["state"]) == ("node-n", "pending")
    assert eviction["reason"].startswith(f"{rule} on port mlx5_0/1 (ib0): critical")
    verdicts = [v for g in eviction["evidence"]["gpus"] for v in g["verdicts"]]
    assert {v["evidence"]["netdev"] for v in verdicts} == {"ib0"}


def test_a_port_back_up_clears_its_verdict(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    assert set(_push_readings(push, "node-u", [{}, DOWN, DOWN, {}])) == {200}
    kinds = [e["kind"] for e in _read(client, tokens, "/v1/events?node=node-u")["data"]]
    assert kinds == ["port_up", "port_down"]  # newest first
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    assert _read(client, tokens, f"/v1/gpus/{gpu_uuid('node-u', 0)}/risk")["verdicts"] == []


def test_the_normal_rate_is_remembered_with_the_port(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    readings = [{}, {"rate_gbps": 200.0}, {"rate_gbps": 200.0}]
    assert set(_push_readings(push, "node-r", readings)) == {200}
    kinds = [e["kind"] for e in _read(client, tokens, "/v1/events?node=node-r")["data"]]
    assert kinds == ["port_degraded"]  # once, not on every slow reading
    [port] = _read(client, tokens, "/v1/nodes/node-r/ports")["data"]
    assert (port["rate_gbps"], port["normal_rate_gbps"], port["normal_width"]) == (200.0, 400.0, 4)
    assert port["degraded"] is True


@pytest.mark.parametrize(
    ("readings", "wakes"),
    [([{}, DOWN], 1), ([{"link_downed": 1}, {"link_downed": 4}], 1),
     ([{"link_downed": 1}, {"link_downed": 2}], 0), ([{}, {"rate_gbps": 200.0}], 0), ([{}, {}], 0)],
)  # fmt: skip
def test_a_port_down_or_a_flap_at_its_limit_wakes_the_planner_at_ingest(
    push: Push, monkeypatch: pytest.MonkeyPatch, readings: list[dict[str, Any]], wakes: int
) -> None:
    woken: list[object] = []
    monkeypatch.setattr(urgent_lane, "notify_wake", lambda engine, nodes=None: woken.append(engine))
    assert set(_push_readings(push, "node-w", readings)) == {200}
    assert len(woken) == wakes


def test_the_real_h100_port_tree_with_one_rail_down_is_one_port_down(
    client: TestClient, push: Push, tokens: dict[str, str], tmp_path: Path
) -> None:
    """GPUd's captured H100 tree as the agent's collector reads it, twice: as captured (its
    unused down ports never were up: no event), then with one rail's link down."""
    if not SHARED.is_dir():
        pytest.skip(f"shared fixtures not found at {SHARED}")
    root = h100_tree(SHARED, tmp_path)
    collector = InfinibandCollector(root)
    start = datetime.now(UTC) - timedelta(seconds=20)
    first = collector.collect(start).ports
    up = [p for p in first if p.state == "ACTIVE" and p.phys_state == "LinkUp"]
    assert len(up) >= 8
    rail = up[0]
    port_dir = root / rail.device / "ports" / str(rail.port)
    (port_dir / "state").write_text("1: DOWN\n")
    (port_dir / "phys_state").write_text("3: Disabled\n")
    second = collector.collect(start + timedelta(seconds=10)).ports
    for i, ports in enumerate((first, second)):
        ts = start + timedelta(seconds=10 * i)
        batch = make_batch("node-h", gpus=2, ticks=1, start=ts)
        batch["ports"] = [p.model_dump(mode="json", exclude_none=True) for p in ports]
        assert push(batch).status_code == 200
    found = [
        e for e in _read(client, tokens, "/v1/events?node=node-h")["data"]
        if e["kind"].startswith("port_")
    ]  # fmt: skip
    assert [(e["kind"], e["details"]["device"], e["details"]["port"]) for e in found] == [
        ("port_down", rail.device, rail.port)
    ]
    assert found[0]["details"]["was_rate_gbps"] == rail.rate_gbps
