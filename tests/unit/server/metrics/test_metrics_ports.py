"""/metrics after a known batch with network adapter ports and host errors: exact lines, base
units, absent values left out; per-port series on the shards, fleet counts on the default page."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

WHOLE_FLEET = {"shard": "0", "shards": "1"}
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
IB0 = 'node="node-ib",device="mlx5_0",port="1",netdev="ib0"'
IB1 = 'node="node-ib",device="mlx5_1",port="1"'
IB2 = 'node="node-ib",device="mlx5_2",port="1"'
ROCE = 'node="node-ib",device="mlx5_bond_0",port="1",netdev="bond0"'


def _port(device: str, at: datetime, **fields: Any) -> dict[str, Any]:
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
        "link_width": 4,
    } | fields


def _ports(at: datetime, tick: int) -> list[dict[str, Any]]:
    """mlx5_0 healthy with counters; mlx5_1 down (Polling); mlx5_2 trained at half rate; mlx5_3
    switched off (Disabled: not a fault); a RoCE port with retransmissions and no IB counters."""
    return [
        _port("mlx5_0", at, netdev="ib0", counters={
            "symbol_error": 10 * tick, "link_downed": 1, "link_error_recovery": 0,
            "port_rcv_errors": 2, "port_xmit_discards": 0, "port_xmit_wait": 99}),
        _port("mlx5_1", at, state="DOWN", state_code=1, phys_state="Polling",
              phys_state_code=2, rate_gbps=10.0),
        _port("mlx5_2", at, rate_gbps=200.0, link_width=2),
        _port("mlx5_3", at, state="DOWN", state_code=1, phys_state="Disabled",
              phys_state_code=3, rate_gbps=10.0),
        _port("mlx5_bond_0", at, netdev="bond0", link_layer="Ethernet", rate_gbps=100.0,
              link_width=None, hw_counters={"roce_adp_retrans": 5 * tick}),
    ]  # fmt: skip


def _event(kind: str, severity: str | None, at: datetime) -> dict[str, Any]:
    details = {"severity": severity} if severity else None
    return {"kind": kind, "ts": at.isoformat(), "details": details}


@pytest.fixture
def known(push: Push) -> None:
    """Two readings 10 s apart (so the second has rates) and three host errors."""
    for tick in (0, 1):
        at = T0 + timedelta(seconds=10 * tick)
        batch = make_batch("node-ib", gpus=1, start=at)
        batch["ports"] = _ports(at, tick)
        if tick == 1:
            batch["events"] = [
                _event("mce", "corrected", at),
                _event("mce", "corrected", at),
                _event("edac", None, at),
            ]
        assert push(batch).status_code == 200
    healthy = make_batch("node-ok", gpus=1, start=T0)
    healthy["ports"] = [_port("mlx5_0", T0)]
    assert push(healthy).status_code == 200


@pytest.fixture
def scrape(client: TestClient, tokens: dict[str, str]) -> Callable[..., list[str]]:
    def _scrape(params: dict[str, str] | None = None) -> list[str]:
        response: httpx.Response = client.get(
            "/metrics", params=params, headers=bearer(tokens["read"])
        )
        assert response.status_code == 200, response.text
        list(text_string_to_metric_families(response.text))  # parses
        return response.text.splitlines()

    return _scrape


def test_shard_has_each_ports_state_rate_and_counters(known: None, scrape: Any) -> None:
    lines = scrape(WHOLE_FLEET)
    for expected in [
        f'fleetwatch_port_state{{{IB0},state="ACTIVE"}} 4',
        f'fleetwatch_port_state{{{IB1},state="DOWN"}} 1',
        f'fleetwatch_port_phys_state{{{IB1},phys_state="Polling"}} 2',
        # Base units: Gb/s -> bits/s.
        f"fleetwatch_port_rate_bits_per_second{{{IB0}}} 400000000000.0",
        f"fleetwatch_port_rate_bits_per_second{{{IB2}}} 200000000000.0",
        f"fleetwatch_port_link_width_lanes{{{IB2}}} 2",
        # Counters as read, zero included; rates since the reading before (10 s).
        f"fleetwatch_port_symbol_errors_total{{{IB0}}} 10",
        f"fleetwatch_port_symbol_errors_per_second{{{IB0}}} 1.0",
        f"fleetwatch_port_link_downed_total{{{IB0}}} 1",
        f"fleetwatch_port_link_downed_per_second{{{IB0}}} 0.0",
        f"fleetwatch_port_link_error_recovery_total{{{IB0}}} 0",
        f"fleetwatch_port_rcv_errors_total{{{IB0}}} 2",
        f"fleetwatch_port_xmit_discards_total{{{IB0}}} 0",
        f"fleetwatch_port_roce_retransmissions_total{{{ROCE}}} 5",
        f"fleetwatch_port_roce_retransmissions_per_second{{{ROCE}}} 0.5",
        'fleetwatch_host_events_total{node="node-ib",kind="edac"} 1',
        'fleetwatch_host_events_total{node="node-ib",kind="mce",severity="corrected"} 2',
    ]:
        assert expected in lines, f"missing line: {expected}"


def test_shard_leaves_out_what_a_port_did_not_report(known: None, scrape: Any) -> None:
    lines = [x for x in scrape(WHOLE_FLEET) if x.startswith("fleetwatch_port_")]
    roce = sorted(x.split("{")[0] for x in lines if 'device="mlx5_bond_0"' in x)
    # No IB counters, no width on the RoCE port: no line, not a 0.
    assert roce == [
        "fleetwatch_port_phys_state",
        "fleetwatch_port_rate_bits_per_second",
        "fleetwatch_port_roce_retransmissions_per_second",
        "fleetwatch_port_roce_retransmissions_total",
        "fleetwatch_port_state",
    ]
    # A first reading has no rates.
    rates = [x for x in lines if x.split("{")[0].endswith("_per_second") and "rate_bits" not in x]
    assert not [x for x in rates if 'node="node-ok"' in x]
    assert [x for x in rates if 'node="node-ib"' in x]
    assert [x for x in lines if 'node="node-ok"' in x and x.startswith("fleetwatch_port_state")]


def test_default_page_has_fleet_port_counts_and_problem_nodes_only(
    known: None, scrape: Any
) -> None:
    lines = scrape()
    for expected in [
        'fleetwatch_ports{state="active"} 4',
        'fleetwatch_ports{state="down"} 2',
        "fleetwatch_ports_degraded 1",
        # mlx5_1 is down; mlx5_3 is down but Disabled on purpose.
        'fleetwatch_node_ports_down{node="node-ib"} 1',
        # mlx5_2 at 200 Gb/s beside 400 Gb/s peers; the RoCE port is compared with RoCE ports.
        'fleetwatch_node_ports_degraded{node="node-ib"} 1',
        'fleetwatch_fleet_host_events_total{kind="mce",severity="corrected"} 2',
        'fleetwatch_fleet_host_events_total{kind="mce",severity="fatal"} 0',
        'fleetwatch_fleet_host_events_total{kind="sxid",severity="fatal"} 0',
        'fleetwatch_fleet_host_events_total{kind="edac"} 1',
    ]:
        assert expected in lines, f"missing line: {expected}"
    assert not [x for x in lines if 'node="node-ok"' in x and "ports" in x]
    assert not [x for x in lines if x.startswith("fleetwatch_port_")]


def test_default_page_without_ports_counts_zero(push: Push, scrape: Any) -> None:
    assert push(make_batch("node-plain", gpus=1)).status_code == 200
    lines = scrape()
    assert 'fleetwatch_ports{state="active"} 0' in lines
    assert 'fleetwatch_ports{state="down"} 0' in lines
    assert "fleetwatch_ports_degraded 0" in lines
    assert not [x for x in lines if x.startswith(("fleetwatch_node_ports_", "fleetwatch_port_"))]
    assert not [x for x in scrape(WHOLE_FLEET) if x.startswith("fleetwatch_port_")]


def test_a_shard_has_only_its_nodes_ports(known: None, scrape: Any) -> None:
    from fleetwatch.server.metrics.shards import node_hash

    shard = {"shard": str(node_hash("node-ib") % 4), "shards": "4"}
    nodes = {
        x.split('node="')[1].split('"')[0]
        for x in scrape(shard)
        if x.startswith("fleetwatch_port_")
    }
    assert "node-ib" in nodes
    assert all(node_hash(n) % 4 == node_hash("node-ib") % 4 for n in nodes)


def test_a_netdev_with_a_quote_is_escaped(push: Push, scrape: Any) -> None:
    batch = make_batch("node-q", gpus=1, start=T0)
    batch["ports"] = [_port("mlx5_0", T0, netdev='ib"0\\')]
    assert push(batch).status_code == 200
    lines = scrape(WHOLE_FLEET)  # parses: the scrape fixture reads it as Prometheus would
    labels = 'node="node-q",device="mlx5_0",port="1",netdev="ib\\"0\\\\"'
    assert f'fleetwatch_port_state{{{labels},state="ACTIVE"}} 4' in lines
