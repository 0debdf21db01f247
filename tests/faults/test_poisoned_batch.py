"""Poisoned batches against a real `fleetwatch server` process, on SQLite and on PostgreSQL.

Node A sends, one after another, batches with a NUL or a lone surrogate in each text field,
overlong names and keys, integers beyond 64 bits, NaN / Infinity / 1e999, timestamps from year 1,
repeated samples that differ and a GPU UUID node B reports; after each, A and B send a normal
batch. Every poisoned batch must get a 4xx (never a 5xx), every normal batch must be stored
(counted back through the read API), and the server's log must hold no traceback and no 500.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.factories import gpu_uuid, make_batch, make_gpu
from tests.integration.live import LiveServer, create_token, live_server

Batch = dict[str, Any]
Poison = Callable[[Batch], None]

# Literals json.dumps cannot write, swapped in for their placeholder after dumping.
YEAR_1_EAST = "0001-01-01T00:00:00+14:00"  # before year 1 once in UTC
YEAR_9999_WEST = "9999-12-31T23:59:59-14:00"  # after year 9999 once in UTC
RAW = {'"@1e999@"': "1e999", '"@-1e999@"': "-1e999", '"@huge@"': "9" * 5000}


def _body(batch: Batch) -> bytes:
    text = json.dumps(batch)  # NaN, Infinity, "\\u0000" and "\\ud800" as JSON writes them
    for placeholder, literal in RAW.items():
        text = text.replace(placeholder, literal)
    return text.encode()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _put(*path: Any, value: Any) -> Poison:
    def poison(batch: Batch) -> None:
        if path[0] == "events" and not batch["events"]:
            batch["events"] = [{"kind": "agent_start", "ts": _now(), "details": {}}]
        target = batch
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return poison


def _details(details: dict[str, Any]) -> Poison:
    def poison(batch: Batch) -> None:
        batch["events"] = [{"kind": "xid", "xid": 79, "ts": _now(), "details": details}]

    return poison


def _repeat_sample_differently(batch: Batch) -> None:
    clash = copy.deepcopy(batch["samples"][0])
    clash["gpu_temp_c"] = 95.0
    batch["samples"].append(clash)


def _claim_node_b_gpu(batch: Batch) -> None:
    stolen = make_gpu("node-b", 0)
    batch["gpus"].append(stolen)
    batch["samples"].append({**batch["samples"][0], "uuid": stolen["uuid"]})


TEXT_FIELDS = [
    ("node", "labels", "rack"),
    ("node", "agent_version"),
    ("node", "boot_id"),
    ("node", "name"),
    ("gpus", 0, "serial"),
    ("gpus", 0, "name"),
    ("gpus", 0, "driver_version"),
    ("gpus", 0, "vbios_version"),
    ("gpus", 0, "pci_bus_id"),
    ("events", 0, "message"),
    ("events", 0, "process"),
    ("events", 0, "kind"),
    ("events", 0, "details", "comm"),
]


def _poisons() -> dict[str, Poison]:
    poisons: dict[str, Poison] = {}
    for path in TEXT_FIELDS:
        where = ".".join(map(str, path))
        poisons[f"NUL in {where}"] = _put(*path, value="x\x00y")
        poisons[f"lone surrogate in {where}"] = _put(*path, value="x\ud800y")
    poisons.update(
        {
            "NUL in a details key": _details({"a\x00": 1}),
            "lone surrogate in a details key": _details({"\udc00": 1}),
            "NUL deep in details": _details({"a": [{"b": ["ok", "x\x00"]}]}),
            "NUL in a label key": _put("node", "labels", value={"ra\x00ck": "r1"}),
            "overlong label key": _put("node", "labels", value={"k" * 10_000: "v"}),
            "overlong label value": _put("node", "labels", "rack", value="v" * 300),
            "overlong node name": _put("node", "name", value="n" * 254),
            "overlong GPU uuid": _put("gpus", 0, "uuid", value="GPU-" + "f" * 200),
            "overlong GPU name": _put("gpus", 0, "name", value="H" * 129),
            "overlong pci_bus_id": _put("gpus", 0, "pci_bus_id", value="0" * 10_000),
            "overlong event message": _put("events", 0, "message", value="m" * 5000),
            "overlong process name": _put("events", 0, "process", value="p" * 257),
            "overlong event kind": _put("events", 0, "kind", value="k" * 65),
            "overlong batch_id": _put("batch_id", value="b" * 129),
            "overlong agent_version": _put("node", "agent_version", value="v" * 65),
            "counter 2^63": _put("samples", 0, "energy_mj", value=2**63),
            "counter 2^64": _put("samples", 0, "ecc_dbe_volatile_total", value=2**64),
            "counter with 5000 digits": _put("samples", 0, "pcie_replay_total", value="@huge@"),
            "negative counter": _put("samples", 0, "pcie_replay_total", value=-1),
            "bitmask 2^64": _put("samples", 0, "clocks_event_reasons", value=2**64),
            "pid 2^63": _put("events", 0, "pid", value=2**63),
            "xid 2^31": _put("events", 0, "xid", value=2**31),
            "GPU index 2^63": _put("gpus", 0, "index", value=2**63),
            "details integer 2^64": _details({"n": 2**64}),
            "details integer with 5000 digits": _details({"n": "@huge@"}),
            "NaN fb_used_mib": _put("samples", 0, "fb_used_mib", value=float("nan")),
            "Infinity fb_used_mib": _put("samples", 0, "fb_used_mib", value=float("inf")),
            "1e999 fb_used_mib": _put("samples", 0, "fb_used_mib", value="@1e999@"),
            "-1e999 power_w": _put("samples", 0, "power_w", value="@-1e999@"),
            "NaN interval_s": _put("node", "interval_s", value=float("nan")),
            "NaN in details": _details({"temp": float("nan")}),
            "Infinity in details": _details({"temp": [1, float("inf")]}),
            "-Infinity in details": _details({"t": {"u": float("-inf")}}),
            "1e999 in details": _details({"temp": "@1e999@"}),
            "sample from year 1": _put("samples", 0, "ts", value="0001-01-01T00:00:00Z"),
            "sample from year 1, +14:00": _put("samples", 0, "ts", value=YEAR_1_EAST),
            "sample at 9999-12-31, -14:00": _put("samples", 0, "ts", value=YEAR_9999_WEST),
            "sample from 1900": _put("samples", 0, "ts", value="1900-01-01T00:00:00Z"),
            "event from 1970": _put("events", 0, "ts", value="1970-01-01T00:00:00Z"),
            "event from year 3000": _put("events", 0, "ts", value="3000-01-01T00:00:00Z"),
            "repeated sample with other values": _repeat_sample_differently,
            "node B's GPU UUID": _claim_node_b_gpu,
        }
    )  # fmt: skip
    return poisons


def _normal(node: str, seq: int) -> Batch:
    event = {"kind": "xid", "xid": 13, "ts": _now(), "message": f"normal {seq}", "pid": 42}
    return make_batch(node, gpus=2, events=[event], start=datetime.now(UTC) - timedelta(seconds=5))


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[tuple[LiveServer, str, str]]:
    agent, read = create_token(database_url, "agent"), create_token(database_url, "read")
    with live_server(database_url, tmp_path) as live:
        yield live, agent, read


@pytest.mark.slow
def test_poisoned_batches_get_4xx_and_normal_traffic_is_stored(
    server: tuple[LiveServer, str, str], database_url: str
) -> None:
    live, agent_token, read_token = server
    backend = database_url.split(":", 1)[0].split("+", 1)[0]
    poisons = _poisons()
    statuses: dict[str, int] = {}
    normal_failures: list[str] = []
    resume_s: list[float] = []
    headers = {"Content-Type": "application/json"}
    with live.client(agent_token) as agent, live.client(read_token) as read:
        for seq, node in enumerate(("node-a", "node-b")):  # both nodes and their GPUs exist
            assert agent.post("/v1/ingest", json=_normal(node, -1 - seq)).status_code == 200
        sent = {"node-a": 1, "node-b": 1}
        for seq, (name, poison) in enumerate(poisons.items()):
            batch = make_batch("node-a", gpus=2, events=[])
            poison(batch)
            answer = agent.post("/v1/ingest", content=_body(batch), headers=headers)
            statuses[name] = answer.status_code
            rejected_at = time.monotonic()
            for node in ("node-a", "node-b"):
                normal = agent.post("/v1/ingest", json=_normal(node, seq))
                if normal.status_code != 200 or normal.json()["duplicate"]:
                    normal_failures.append(f"{node} after {name!r}: {normal.status_code}")
                sent[node] += 1
                if node == "node-a":
                    resume_s.append(time.monotonic() - rejected_at)

        stored = {node: _stored(read, node) for node in sent}
        metrics = read.get("/metrics").text
    log = live.log.read_text(errors="replace")

    by_status = Counter(statuses.values())
    errors_500, tracebacks = log.count('" 500'), log.count("Traceback")
    worst_ms = max(resume_s) * 1000
    summary = [
        f"[{backend}] {len(poisons)} poisoned batches from node-a, answers {dict(by_status)}:",
        *(f"  {status}  {name}" for name, status in statuses.items()),
        f"[{backend}] normal batches sent {sent}; stored (samples per GPU, Xid events) {stored}",
        f"[{backend}] node-a's next batch after a poisoned one was stored within {worst_ms:.0f} ms "
        "at worst (one request; measured, not asserted)",
        f"[{backend}] server log: {errors_500} answers 500, {tracebacks} tracebacks",
    ]
    sys.stdout.write("\n" + "\n".join(summary) + "\n")

    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert statuses["node B's GPU UUID"] == 409
    assert not normal_failures, normal_failures
    for node, count in sent.items():
        assert stored[node] == (count, count), (node, stored[node], count)
    rejected = f'fleetwatch_ingest_batches_total{{outcome="rejected"}} {float(len(poisons))}'
    assert rejected in metrics
    # The access log is on: it shows every refusal, so its lack of 500s is a real observation.
    assert log.count('" 422') + log.count('" 409') == len(poisons)
    assert "Traceback" not in log
    assert '" 500' not in log and " 500 Internal" not in log


def _stored(read: httpx.Client, node: str) -> tuple[int, int]:
    """(batches' worth of samples, Xid events) of ``node`` as the read API returns them."""
    per_gpu = []
    for index in range(2):
        answer = read.get(f"/v1/gpus/{gpu_uuid(node, index)}/samples", params={"since": "1h"})
        assert answer.status_code == 200, answer.text
        per_gpu.append(answer.json()["count"])
    assert per_gpu[0] == per_gpu[1], per_gpu
    events = read.get("/v1/events", params={"node": node, "kind": "xid", "limit": 10_000})
    assert events.status_code == 200, events.text
    return per_gpu[0], len(events.json()["data"])
