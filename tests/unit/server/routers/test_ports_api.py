"""A node's network adapter ports on the server (issue 13): the newest reading of each port is
kept and shown by ``GET /v1/nodes/{name}/ports``, with its counters' rates since the reading
before; counter resets (a drop, a reboot) count from zero, as for GPU counters."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

Read = Callable[..., httpx.Response]
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def _port(at: datetime, device: str = "mlx5_0", **fields: Any) -> dict[str, Any]:
    return {
        "device": device,
        "port": 1,
        "ts": at.isoformat(),
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "state_code": 4,
        "phys_state": "LinkUp",
        "phys_state_code": 5,
        "rate_gbps": 400.0,
        "counters": {"symbol_error": 0, "link_downed": 1},
    } | fields


def _batch(*ports: dict[str, Any], boot_id: str = "boot-1") -> dict[str, Any]:
    batch = make_batch("node-ib", gpus=1, start=T0, boot_id=boot_id)
    batch["ports"] = list(ports)
    return batch


def _ports(read: Read) -> dict[str, dict[str, Any]]:
    body = read("/v1/nodes/node-ib/ports").json()
    assert body["count"] == len(body["data"]) and body["node"] == "node-ib"
    return {p["device"]: p for p in body["data"]}


def test_the_newest_reading_of_each_port_is_shown(push: Push, read: Read) -> None:
    first = _batch(_port(T0), _port(T0, "mlx5_bond_0", link_layer="Ethernet"))
    assert push(first).status_code == 200
    ports = _ports(read)
    assert sorted(ports) == ["mlx5_0", "mlx5_bond_0"]
    assert ports["mlx5_bond_0"]["link_layer"] == "Ethernet"
    assert ports["mlx5_0"]["rates"] is None  # a first reading has nothing to count from
    assert ports["mlx5_0"]["netdev"] is None and ports["mlx5_0"]["hw_counters"] is None

    later = T0 + timedelta(seconds=10)
    down = _port(later, state="DOWN", state_code=1, phys_state="Polling", phys_state_code=2,
                 rate_gbps=40.0, counters={"symbol_error": 50, "link_downed": 2})  # fmt: skip
    assert push(_batch(down)).status_code == 200
    port = _ports(read)["mlx5_0"]
    assert (port["state"], port["phys_state"], port["rate_gbps"]) == ("DOWN", "Polling", 40.0)
    assert port["rates"]["counters"]["symbol_error"] == {
        "per_s": 5.0,
        "increase": 50,
        "reset": False,
    }
    assert port["rates_since"].startswith(T0.isoformat()[:19])


def test_several_readings_in_one_batch_are_taken_in_time_order(push: Push, read: Read) -> None:
    readings = [
        _port(T0 + timedelta(seconds=10 * i), counters={"symbol_error": 10 * i}) for i in (2, 0, 1)
    ]
    assert push(_batch(*readings)).status_code == 200
    port = _ports(read)["mlx5_0"]
    assert port["counters"] == {"symbol_error": 20}
    assert port["rates"]["counters"]["symbol_error"]["per_s"] == 1.0


def test_a_counter_that_dropped_or_a_reboot_counts_from_zero(push: Push, read: Read) -> None:
    assert push(_batch(_port(T0, counters={"symbol_error": 100}))).status_code == 200
    dropped = _port(T0 + timedelta(seconds=10), counters={"symbol_error": 30})
    assert push(_batch(dropped)).status_code == 200
    rate = _ports(read)["mlx5_0"]["rates"]["counters"]["symbol_error"]
    assert rate == {"per_s": 3.0, "increase": 30, "reset": True}

    rebooted = _port(T0 + timedelta(seconds=20), counters={"symbol_error": 40})
    assert push(_batch(rebooted, boot_id="boot-2")).status_code == 200
    rate = _ports(read)["mlx5_0"]["rates"]["counters"]["symbol_error"]
    assert rate == {"per_s": 4.0, "increase": 40, "reset": True}


def test_an_older_reading_changes_nothing(push: Push, read: Read) -> None:
    assert push(_batch(_port(T0, counters={"symbol_error": 9}))).status_code == 200
    stale = _port(T0 - timedelta(seconds=10), state="DOWN", counters={"symbol_error": 1})
    assert push(_batch(stale)).status_code == 200
    port = _ports(read)["mlx5_0"]
    assert (port["state"], port["counters"]) == ("ACTIVE", {"symbol_error": 9})


def test_a_node_without_ports_has_none_and_an_unknown_node_is_404(
    push: Push, read: Read, client: TestClient, tokens: dict[str, str]
) -> None:
    assert push(make_batch("node-plain", gpus=1)).status_code == 200
    assert read("/v1/nodes/node-plain/ports").json() == {
        "node": "node-plain",
        "data": [],
        "count": 0,
    }
    missing = client.get("/v1/nodes/nowhere/ports", headers=bearer(tokens["read"]))
    assert missing.status_code == 404
