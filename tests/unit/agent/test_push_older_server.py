"""A new agent pushing to a server older than ``GpuIdentity.mig`` (issue 13): the server refuses
the field with a 422, the agent sends the same batch without it, and the readings arrive.

The fake server answers exactly what the server at commit 78ba9bd answers (recorded by posting a
batch with a MIG layout to it): a 422 naming ``body.gpus.N.mig`` as an extra input.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetwatch.agent.collectors.base import Collection
from fleetwatch.agent.loop import build_batch, encode
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.agent.wire_compat import refuses_only_newer_fields, without_newer_fields
from fleetwatch.telemetry import Batch, NodeInfo

EXTRA = "Extra inputs are not permitted"
OLD_GPU_KEYS = {"uuid", "index", "serial", "pci_bus_id", "name", "driver_version", "vbios_version"}
LAYOUT = {"current": "enabled", "instances": [{"gpu_instance_id": 7, "profile": "1g.5gb"}]}


def _old_server_answer(batch: dict[str, Any]) -> httpx.Response:
    """What the server from before wire v1's MIG layout answers (its models forbid extras)."""
    detail = [
        {"loc": ["body", "gpus", i, key], "msg": EXTRA, "type": "value_error"}
        for i, gpu in enumerate(batch["gpus"])
        for key in sorted(gpu.keys() - OLD_GPU_KEYS)
    ]  # fmt: skip
    if not detail:
        Batch.model_validate_json(json.dumps(batch))  # a valid batch today too
        return httpx.Response(200, json={"accepted": {"samples": len(batch["samples"])}})
    where = ".".join(map(str, detail[0]["loc"]))
    more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
    error = f"invalid batch: {where}: {detail[0]['msg']}{more}; nothing was stored"
    return httpx.Response(422, json={"error": error, "detail": detail})


def _batch(batch_id: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {
        "batch_id": batch_id,
        "node": {"name": "node-m"},
        "gpus": [
            {"uuid": "GPU-0", "index": 0, "name": "NVIDIA A100-SXM4-40GB", "mig": LAYOUT},
            {"uuid": "GPU-1", "index": 1, "name": "NVIDIA A100-SXM4-40GB"},
        ],
        "samples": [
            {"uuid": "GPU-0", "ts": now, "gpu_temp_c": 37.0, "ecc_dbe_volatile_total": 1},
            {"uuid": "GPU-1", "ts": now, "gpu_temp_c": 36.0, "gpu_util_pct": 5.0},
        ],
    }


def _gz(batch: dict[str, Any]) -> bytes:
    return gzip.compress(json.dumps(batch).encode())


def _pusher(tmp_path: Path) -> tuple[Pusher, Spool, list[bytes]]:
    bodies: list[bytes] = []

    def old_server(request: httpx.Request) -> httpx.Response:
        bodies.append(gzip.decompress(request.content))
        return _old_server_answer(json.loads(bodies[-1]))

    client = httpx.Client(transport=httpx.MockTransport(old_server), base_url="http://server")
    spool = Spool(tmp_path / "spool")
    metrics = AgentMetrics()
    return (
        Pusher(client, spool, metrics, rejected_dir=tmp_path / "rej", rng=random.Random(1)),
        spool,
        bodies,
    )


def test_an_older_server_gets_the_batch_without_the_mig_layout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pusher, spool, bodies = _pusher(tmp_path)
    for batch_id in ("a", "b"):
        spool.put(batch_id, _gz(_batch(batch_id)), samples=2, events=0)

    with caplog.at_level(logging.WARNING):
        pusher.drain()

    assert spool.depth() == (0, 0)  # both acknowledged, nothing rejected
    assert not (tmp_path / "rej").exists()
    assert len(bodies) == 4  # each batch: refused with its layout, taken without it
    first, second = json.loads(bodies[0]), json.loads(bodies[1])
    assert first["gpus"][0]["mig"] == LAYOUT
    assert "mig" not in second["gpus"][0]
    # Nothing but the layout is left out: the readings of the MIG GPU arrive as read.
    first["gpus"][0].pop("mig")
    assert second == first
    warnings = [r for r in caplog.records if "older than this agent" in r.getMessage()]
    assert len(warnings) == 1  # once, not per batch


def test_the_reduced_body_is_the_same_bytes_every_time() -> None:
    body = _gz(_batch("a"))
    once, again = without_newer_fields(body), without_newer_fields(body)
    assert once is not None and once == again  # a replay after a lost ack is a duplicate


def test_a_body_without_newer_fields_or_not_a_batch_is_left_alone() -> None:
    plain = _batch("a")
    plain["gpus"][0].pop("mig")
    assert without_newer_fields(_gz(plain)) is None
    assert without_newer_fields(b"not gzip") is None
    assert without_newer_fields(gzip.compress(b"[1, 2]")) is None


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ([{"loc": ["body", "gpus", 0, "mig"], "msg": EXTRA}], True),
        ([{"loc": ["body", "gpus", 3, "mig"], "msg": "x", "type": "extra_forbidden"}], True),
        # Any other problem in the same answer: the batch is refused as before.
        ([{"loc": ["body", "gpus", 0, "mig"], "msg": EXTRA},
          {"loc": ["body", "samples", 0, "gpu_temp_c"], "msg": "too hot"}], False),
        ([{"loc": ["body", "gpus", 0, "serial"], "msg": EXTRA}], False),
        ([{"loc": ["body", "gpus", 0, "mig", "current"], "msg": "bad mode"}], False),
        ([{"loc": ["body", "node", "mig"], "msg": EXTRA}], False),
        ([], False),
    ],
)  # fmt: skip
def test_only_a_refusal_of_newer_fields_alone_counts(detail: list[Any], expected: bool) -> None:
    response = httpx.Response(422, json={"error": "invalid batch", "detail": detail})
    assert refuses_only_newer_fields(response) is expected
    assert not refuses_only_newer_fields(httpx.Response(400, json={"detail": detail}))


def test_a_422_for_another_reason_still_moves_the_batch_aside(tmp_path: Path) -> None:
    pusher, spool, bodies = _pusher(tmp_path)
    bad = _batch("bad")
    bad["gpus"][1]["colour"] = "green"  # unknown to every server: refused with or without mig
    spool.put("bad", _gz(bad), samples=2, events=0)
    pusher.drain()
    assert spool.depth() == (0, 0)
    assert len(bodies) == 1
    assert (tmp_path / "rej" / "bad.json.gz").exists()


# -- a server older than Batch.ports (adapter ports) ----------------------------------------

OLD_BATCH_KEYS = {"batch_id", "node", "gpus", "samples", "events"}
PORT = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "counters": {"symbol_error": 0}}


def _pre_ports_answer(batch: dict[str, Any]) -> httpx.Response:
    """A server from before ``Batch.ports`` refuses the top-level key as it refuses any extra
    (the same loc shape the server gives today for an unknown top-level key, see
    tests/unit/server/ingest/test_ingest_ports.py); it knows ``mig`` already."""
    extra = sorted(batch.keys() - OLD_BATCH_KEYS)
    if not extra:
        return _old_server_answer({**batch, "gpus": [{k: v for k, v in g.items() if k != "mig"}
                                                     for g in batch["gpus"]]})  # fmt: skip
    detail = [{"loc": ["body", key], "msg": EXTRA, "type": "extra_forbidden"} for key in extra]
    return httpx.Response(422, json={"error": "invalid batch", "detail": detail})


def test_an_older_server_gets_the_batch_without_its_ports(tmp_path: Path) -> None:
    bodies: list[bytes] = []

    def old_server(request: httpx.Request) -> httpx.Response:
        bodies.append(gzip.decompress(request.content))
        return _pre_ports_answer(json.loads(bodies[-1]))

    client = httpx.Client(transport=httpx.MockTransport(old_server), base_url="http://server")
    spool = Spool(tmp_path / "spool")
    pusher = Pusher(client, spool, AgentMetrics(), rejected_dir=tmp_path / "rej")
    batch = _batch("p")
    batch["gpus"][0].pop("mig")
    batch["ports"] = [{**PORT, "ts": batch["samples"][0]["ts"]}]
    spool.put("p", _gz(batch), samples=3, events=0)

    pusher.drain()

    assert spool.depth() == (0, 0) and not (tmp_path / "rej").exists()
    assert len(bodies) == 2
    first, second = json.loads(bodies[0]), json.loads(bodies[1])
    assert first["ports"] == batch["ports"] and "ports" not in second
    first.pop("ports")
    assert second == first  # the GPU readings arrive as read


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ([{"loc": ["body", "ports"], "msg": EXTRA}], True),
        ([{"loc": ["body", "ports"], "msg": "x", "type": "extra_forbidden"},
          {"loc": ["body", "gpus", 0, "mig"], "msg": EXTRA}], True),
        # A port the server knows but finds wrong is no older server's answer.
        ([{"loc": ["body", "ports", 0, "rate_gbps"], "msg": "too fast"}], False),
        ([{"loc": ["body", "ports"], "msg": "Input should be a valid list"}], False),
        ([{"loc": ["body", "racks"], "msg": EXTRA}], False),
    ],
)  # fmt: skip
def test_a_refusal_of_ports_alone_counts(detail: list[Any], expected: bool) -> None:
    response = httpx.Response(422, json={"error": "invalid batch", "detail": detail})
    assert refuses_only_newer_fields(response) is expected


def test_a_batch_without_ports_never_carries_the_key() -> None:
    """Else every push to a server older than ports would be refused once first."""
    batch = build_batch(NodeInfo(name="n"), Collection(), "b")
    assert "ports" not in json.loads(gzip.decompress(encode(batch)))
