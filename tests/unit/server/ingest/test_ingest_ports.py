"""Adapter ports on the wire (issue 13): a batch carrying them is taken; a wrong port field is a
422 naming it (``body.ports.<i>.<field>``); the fast path leaves such batches to pydantic."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from tests.factories import make_batch
from tests.unit.server.conftest import Push

from fleetwatch.config import ServerSettings
from fleetwatch.server.ingest.batch_decoder import decode_batch, decode_fast, ingest_limits
from fleetwatch.telemetry import Batch, PortSample


def _port(ts: str, **fields: Any) -> dict[str, Any]:
    return {
        "device": "mlx5_0",
        "port": 1,
        "ts": ts,
        "link_layer": "InfiniBand",
        "node_guid": "0a7f:bc12:45ef:d23b",
        "state": "ACTIVE",
        "state_code": 4,
        "phys_state": "LinkUp",
        "phys_state_code": 5,
        "rate_gbps": 400.0,
        "link_width": 4,
        "link_speed": "NDR",
        "counters": {"symbol_error": 0, "link_downed": 255, "port_xmit_data": 230442669431839},
        "hw_counters": {"roce_adp_retrans": 3},
    } | fields


def _batch_with_ports(*ports: dict[str, Any]) -> dict[str, Any]:
    batch = make_batch("node-ib", gpus=1)
    ts = batch["samples"][0]["ts"]
    batch["ports"] = [_port(ts, **p) for p in ports] or [_port(ts)]
    return batch


def test_a_batch_with_ports_is_taken(push: Push) -> None:
    batch = _batch_with_ports({}, {"device": "mlx5_bond_0", "link_layer": "Ethernet"})
    response = push(batch)
    assert response.status_code == 200, response.text


def test_a_port_with_only_its_identity_is_taken_and_stays_sparse(push: Push) -> None:
    batch = make_batch("node-ib", gpus=1)
    batch["ports"] = [{"device": "hfi1_0", "port": 1, "ts": batch["samples"][0]["ts"]}]
    assert push(batch).status_code == 200
    port = Batch.model_validate_json(json.dumps(batch)).ports[0]  # type: ignore[index]
    assert port.model_dump(exclude_none=True).keys() == {"device", "port", "ts"}


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"device": "mlx5 0"}, ["body", "ports", 0, "device"]),
        ({"port": 256}, ["body", "ports", 0, "port"]),
        ({"rate_gbps": -1.0}, ["body", "ports", 0, "rate_gbps"]),
        ({"rate_gbps": "400"}, ["body", "ports", 0, "rate_gbps"]),
        ({"state_code": 4.5}, ["body", "ports", 0, "state_code"]),
        ({"node_guid": "0x58a2e10300a7820e"}, ["body", "ports", 0, "node_guid"]),
        ({"netdev": "a-very-long-interface"}, ["body", "ports", 0, "netdev"]),
        ({"link_width": 0}, ["body", "ports", 0, "link_width"]),
        ({"counters": {"symbol_error": -1}}, ["body", "ports", 0, "counters", "symbol_error"]),
        ({"counters": {"symbol_error": 2**63}}, ["body", "ports", 0, "counters", "symbol_error"]),
        ({"counters": {"bad name": 1}}, ["body", "ports", 0, "counters"]),
        ({"hw_counters": {f"c{i}": 0 for i in range(129)}}, ["body", "ports", 0, "hw_counters"]),
        ({"colour": "green"}, ["body", "ports", 0, "colour"]),
    ],
)
def test_a_wrong_port_field_is_a_422_naming_it(
    push: Push, fields: dict[str, Any], loc: list[Any]
) -> None:
    response = push(_batch_with_ports(fields))
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [d["loc"] for d in detail] == [loc]
    assert ".".join(map(str, loc)) in response.json()["error"]


def test_an_unknown_top_level_field_is_named_as_older_agents_expect(push: Push) -> None:
    """What a server older than ``ports`` answers for it (the agent's resend relies on it)."""
    batch = make_batch("node-ib", gpus=1) | {"racks": []}
    response = push(batch)
    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert (problem["loc"], problem["msg"]) == (["body", "racks"], "Extra inputs are not permitted")


def test_the_fast_path_leaves_ports_to_pydantic_and_keeps_them() -> None:
    batch = _batch_with_ports()
    body = json.dumps(batch).encode()
    limits = ingest_limits(ServerSettings(), datetime.now(UTC))
    assert decode_fast(body, limits) is None
    decoded = decode_batch(body, limits)
    assert decoded.ports is not None
    (port,) = decoded.ports
    sent = json.dumps(batch["ports"][0])
    expected = PortSample.model_validate_json(sent).model_dump(exclude_none=True)
    assert port == expected and port["counters"]["link_downed"] == 255
    # Without ports, the fast path takes the batch as before.
    batch.pop("ports")
    assert decode_fast(json.dumps(batch).encode(), limits) is not None


def test_the_ports_are_documented_in_openapi(client: Any) -> None:
    schema = client.get("/openapi.json").json()
    port = schema["components"]["schemas"]["PortSample"]["properties"]
    assert "InfiniBand" in port["link_layer"]["description"]
    assert "4-byte" in schema["components"]["schemas"]["PortSample"]["description"]
    batch_ports = schema["components"]["schemas"]["Batch"]["properties"]["ports"]
    assert "older" in batch_ports["description"]
