"""A generated corpus of ingest bodies, valid and hostile, for comparing the two validators.

:func:`valid_batch` builds a batch as some agent might (any subset of fields, values anywhere in
their range, ints where floats go, offsets, PCI ids in every spelling, events with details);
:data:`MUTATIONS` each break one thing in it (a type, a bound, a pattern, a timestamp, a
limit, text no database stores, duplicates, unknown fields, deep JSON) or in its bytes (bad
UTF-8, truncation, duplicate keys, number literals JSON has not). Everything is drawn from the
``random.Random`` given, so a seed reproduces a body.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from fleetwatch.telemetry import SAMPLE_FIELDS

# The clock every body is judged at (IngestLimits.now in the tests).
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)

Body = dict[str, Any]

_FLOAT_RANGES = {
    "gpu_temp_c": (-50, 200),
    "memory_temp_c": (-50, 200),
    "power_w": (0, 10_000),
    "power_limit_w": (0, 10_000),
    "sm_clock_mhz": (0, 20_000),
    "mem_clock_mhz": (0, 50_000),
    "fan_speed_pct": (0, 100),
    "gpu_util_pct": (0, 100),
    "mem_copy_util_pct": (0, 100),
    "fb_used_mib": (0, 1e300),
    "fb_total_mib": (0, 1e300),
}
_INT_RANGES = {
    "pcie_link_gen": (1, 16),
    "pcie_link_width": (1, 64),
    "gpu_recovery_action": (0, 255),
}
_INT64_MAX = 2**63 - 1


def _float(rng: random.Random, low: float, high: float) -> float | int:
    pick = rng.random()
    if pick < 0.15:
        return rng.choice([low, high])  # the bounds themselves are allowed
    if pick < 0.3:
        return rng.randint(int(low), int(min(high, 10**6)))  # an int where a float goes
    if pick < 0.35:
        return -0.0 if low <= 0 <= high else low
    if pick < 0.4:
        return float(f"{rng.uniform(low, min(high, 1e6)):.17g}")  # every digit a float has
    return round(rng.uniform(low, min(high, 1e6)), rng.randint(0, 4))


def _sample_value(rng: random.Random, name: str, kind: str) -> Any:
    if kind == "flag":
        return rng.random() < 0.5
    if name in _FLOAT_RANGES:
        return _float(rng, *_FLOAT_RANGES[name])
    low, high = _INT_RANGES.get(name, (0, _INT64_MAX))
    return rng.choice([low, high, rng.randint(low, min(high, 10**12)), rng.randint(low, high)])


def timestamp(rng: random.Random, when: datetime) -> str:
    """``when`` written the ways agents write it (all of which the server accepts)."""
    style = rng.randrange(8)
    if style == 0:
        return when.isoformat()
    if style == 1:
        return when.isoformat().replace("+00:00", "Z")
    if style == 2:
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    if style == 3:
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    if style == 4:
        zone = timezone(timedelta(minutes=rng.choice([-600, -330, 60, 120, 345, 840])))
        return when.astimezone(zone).isoformat()
    if style == 5:
        return when.isoformat(sep=" ")
    if style == 6:
        return when.isoformat().replace("+00:00", "z").replace("T", "t")
    return when.astimezone(timezone(timedelta(hours=2))).isoformat().replace("+02:00", "+0200")


def _pci(rng: random.Random, index: int) -> str:
    bus = 0x18 + 0x10 * index
    return rng.choice(
        [f"0000:{bus:02x}:00.0", f"00000000:{bus:02X}:00.0", f"{bus:02x}:00.0", f"0:{bus:x}:0.0"]
    )


def _details(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    scalars = [
        lambda: rng.randint(-(2**63), _INT64_MAX),
        lambda: rng.uniform(-1e6, 1e6),
        lambda: rng.choice(["kmsg", "NVRM: Xid 79", "ü \U0001f600", ""]),
        lambda: rng.choice([True, False, None]),
        lambda: rng.randint(-5, 5),
        lambda: 2.5,
    ]
    if pick < 6:
        return scalars[pick]()
    if pick < 8:
        return {f"k{i}": _details(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [_details(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def valid_batch(rng: random.Random) -> Body:
    """A batch both validators accept (checked by the tests that use it)."""
    name = rng.choice(["node-a", "gpu-node-017", "n", "A.b_c-1", "x" * 253])
    gpus = []
    for index in range(rng.randint(0, 8)):
        gpu: dict[str, Any] = {
            "uuid": f"{rng.choice(['GPU', 'MIG'])}-{index:04d}-{rng.randrange(10**6)}"
        }
        gpu["index"] = index if rng.random() < 0.9 else 1023
        for key, value in (
            ("serial", f"1652{rng.randrange(10**9):09d}"),
            ("pci_bus_id", _pci(rng, index)),
            ("name", "NVIDIA H100 80GB HBM3"),
            ("driver_version", "550.90.07"),
            ("vbios_version", "96.00.99.00.01"),
        ):
            if rng.random() < 0.8:
                gpu[key] = value if rng.random() < 0.95 else None
        gpus.append(gpu)
    samples = []
    start = NOW - timedelta(seconds=rng.choice([60, 3600, 86400 * 29]))
    for tick in range(rng.randint(1, 6)):
        when = start + timedelta(
            seconds=10 * tick, microseconds=rng.choice([0, rng.randrange(10**6)])
        )
        for gpu in gpus:
            sample: dict[str, Any] = {"uuid": gpu["uuid"], "ts": timestamp(rng, when)}
            full = rng.random() < 0.5
            for spec in SAMPLE_FIELDS:
                if full or rng.random() < 0.3:
                    sample[spec.name] = _sample_value(rng, spec.name, spec.kind)
                elif rng.random() < 0.05:
                    sample[spec.name] = None
            samples.append(sample)
    events = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        event: dict[str, Any] = {
            "kind": rng.choice(["xid", "gpu_lost", "agent_start", "nvlink_down"]),
            "ts": timestamp(rng, NOW - timedelta(seconds=rng.randrange(1, 3600))),
        }
        if event["kind"] == "xid" or rng.random() < 0.3:
            event["xid"] = rng.choice([0, 13, 48, 79, 65535])
        if gpus and rng.random() < 0.5:
            event["uuid"] = rng.choice(gpus)["uuid"]
        if rng.random() < 0.5:
            event["pci_bus_id"] = _pci(rng, rng.randrange(8))
        for key, value in (
            ("message", "GPU has fallen off the bus."),
            ("pid", rng.choice([0, 1234, _INT64_MAX])),
            ("process", "python"),
            ("details", {"raw": _details(rng, 1)} if rng.random() < 0.3 else {"raw": "NVRM"}),
        ):
            if rng.random() < 0.5:
                event[key] = value
        events.append(event)
    node: dict[str, Any] = {"name": name}
    if rng.random() < 0.8:
        node["labels"] = {
            f"l_{i}": rng.choice(["a", "r12", "x" * 256, ""]) for i in range(rng.randint(0, 64))
        }
    for key, value in (
        ("interval_s", rng.choice([10, 10.0, 0.5, 3600, 1e-9])),
        ("push_interval_s", rng.choice([None, 60, 86400, 0.25])),
        ("agent_version", rng.choice(["0.1.0", None, "v" * 64])),
        ("boot_id", rng.choice(["5f0e6a4c-2b1d", None, "b" * 64])),
    ):
        if rng.random() < 0.7:
            node[key] = value
    batch: Body = {
        "batch_id": rng.choice(["b-1", "0b9c5e1e-4f7d", "a:b.c_d-e", "z" * 128]),
        "node": node,
    }
    for key, value in (("gpus", gpus), ("samples", samples), ("events", events)):
        if value or rng.random() < 0.5:
            batch[key] = value
    return batch


# -- mutations: each breaks one thing; some may leave the batch valid (both must then agree) ----

WRONG_VALUES: list[Any] = [
    "41", "", "x" * 300, True, False, None, 1.5, 2.0, -1, -0.5, 0, 2**63, 2**64, -(2**63) - 1,
    10**30, 1e300, [], {}, [1], {"a": 1}, "2026-11-30T05:00:00Z", "GPU-1", "\x00", "node-a\n",
    "@NaN@", "@Infinity@", "@-Infinity@", "@1e999@", "@huge@", "@-0@", "@1E2@", "@\\ud800@",
]  # fmt: skip

# Literals json.dumps cannot write, swapped in for their "@...@" placeholder after dumping.
RAW_LITERALS = {
    '"@NaN@"': "NaN",
    '"@Infinity@"': "Infinity",
    '"@-Infinity@"': "-Infinity",
    '"@1e999@"': "1e999",
    '"@huge@"': "9" * 5000,
    '"@-0@"': "-0",
    '"@1E2@"': "1E2",
    '"@\\\\ud800@"': '"\\ud800"',
}


def encode(batch: Body) -> bytes:
    text = json.dumps(batch)
    for placeholder, literal in RAW_LITERALS.items():
        text = text.replace(placeholder, literal)
    text = re.sub(r'"@deep(\d+)@"', lambda m: "[" * int(m[1]) + "1" + "]" * int(m[1]), text)
    return text.encode()


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``value`` a value sits at (object members and list items)."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*path, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += _paths(inner, (*path, i))
    return found


def _container(batch: Body, path: tuple[Any, ...]) -> Any:
    target: Any = batch
    for key in path[:-1]:
        target = target[key]
    return target


def _replace_any_value(batch: Body, rng: random.Random) -> None:
    path = rng.choice(_paths(batch))
    _container(batch, path)[path[-1]] = rng.choice(WRONG_VALUES)


def _delete_any_member(batch: Body, rng: random.Random) -> None:
    members = [p for p in _paths(batch) if isinstance(p[-1], str)]
    path = rng.choice(members)
    del _container(batch, path)[path[-1]]


def _add_unknown_member(batch: Body, rng: random.Random) -> None:
    objects = [batch] + [
        inner for p in _paths(batch) if isinstance(inner := _container(batch, p)[p[-1]], dict)
    ]
    rng.choice(objects)[rng.choice(["extra", "gpu_temp_f", "version", "Uuid", "ts "])] = 1


def _retime(batch: Body, rng: random.Random) -> None:
    stamped = [p for p in _paths(batch) if p[-1] == "ts"]
    if not stamped:
        return
    offset = rng.choice([
        timedelta(minutes=5), timedelta(minutes=5, microseconds=1), timedelta(minutes=6),
        -timedelta(days=30), -timedelta(days=30, seconds=1), -timedelta(days=365 * 2000),
    ])  # fmt: skip
    text = rng.choice([
        timestamp(rng, NOW + offset), "2026-11-30T11:00:00", "2026-11-30T11:00:00.1234567Z",
        "2026-11-30T11:00:00.9999999Z", "2026-11-30T11:00:00+02", "2026-11-30T11:00Z",
        "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2026-02-30T00:00:00Z",
        "2026-11-30T24:00:00Z", "2026-11-30T11:59:60Z", "2026-11-30T11:00:00+24:00",
        "2026-11-30T11:00:00+02:60", "1700000000", "yesterday", "２０２６-11-30T11:00:00Z",
        "2026-11-30T11:00:00.Z", " 2026-11-30T11:00:00Z", "2026-11-30T11:00:00Z\n",
    ])  # fmt: skip
    path = rng.choice(stamped)
    _container(batch, path)["ts"] = text


def _repeat_sample(batch: Body, rng: random.Random) -> None:
    if not batch.get("samples"):
        return
    copy = dict(rng.choice(batch["samples"]))
    if rng.random() < 0.5:
        copy["gpu_temp_c"] = 99.0 if copy.get("gpu_temp_c") != 99.0 else 98.0
    batch["samples"].insert(rng.randrange(len(batch["samples"]) + 1), copy)


def _repeat_gpu(batch: Body, rng: random.Random) -> None:
    if not batch.get("gpus"):
        return
    copy = dict(rng.choice(batch["gpus"]))
    if rng.random() < 0.5:
        copy["serial"] = "other"
    batch["gpus"].append(copy)


def _deep_details(batch: Body, rng: random.Random) -> None:
    depth = rng.choice([60, 63, 64, 65, 120, 190, 195, 196, 197, 198, 199, 200, 400, 3000])
    details = {"deep": f"@deep{depth}@"}  # nested lists, written in by encode()
    event = {"kind": "agent_start", "ts": timestamp(rng, NOW), "details": details}
    batch.setdefault("events", []).append(event)


# Details of the kinds the rules read (fleetwatch.event_details): readable, and each one way not.
_JUDGED_DETAILS: list[tuple[str, dict[str, Any]]] = [
    ("mce", {"severity": "deferred", "bank": 5, "cpu": 0}),
    ("mce", {"severity": "deferred", "bank": [1]}),
    ("mce", {"severity": "fatal", "bank": True}),
    ("sxid", {"severity": "fatal", "sxid": 12028, "link": 3}),
    ("sxid", {"severity": "fatal", "sxid": [12028]}),
    ("pcie_aer", {"severity": "corrected", "errors": ["RxErr"]}),
    ("pcie_aer", {"severity": "corrected", "errors": ["RxErr", 3]}),
    ("pcie_aer", {"severity": 2}),
    ("edac", {"severity": "corrected", "count": 4294967295}),
    ("edac", {"severity": "corrected", "count": 4294967296}),
    ("edac", {"severity": "corrected", "count": _INT64_MAX}),
    ("edac", {"severity": "corrected", "count": 2.0}),
    ("port_flap", {"device": "mlx5_0", "port": 1, "increase": "2"}),
]


def _judged_details(batch: Body, rng: random.Random) -> None:
    kind, details = rng.choice(_JUDGED_DETAILS)
    event = {"kind": kind, "ts": timestamp(rng, NOW), "details": dict(details)}
    batch.setdefault("events", []).insert(0, event)


def _text_no_database_stores(batch: Body, rng: random.Random) -> None:
    texts = [
        p for p in _paths(batch) if isinstance(_container(batch, p)[p[-1]], str) and p[-1] != "ts"
    ]
    if texts:
        path = rng.choice(texts)
        bad = rng.choice(["\x00", "@\\ud800@", "\U0001f600", "\n", "\u2028"])
        holder = _container(batch, path)
        holder[path[-1]] = holder[path[-1]] + bad if not bad.startswith("@") else bad


def _odd_labels(batch: Body, rng: random.Random) -> None:
    node = batch.get("node")
    if isinstance(node, dict):
        node["labels"] = rng.choice([
            {f"k{i}": "v" for i in range(65)}, {"rack\n": "r"}, {"1rack": "r"}, {"_": "x" * 257},
            {"k" * 63: "v"}, {"k" * 64: "v"}, {"rack-id": "r"}, {"ok": None}, {"ok": 1}, [],
        ])  # fmt: skip


def _over_limits(batch: Body, rng: random.Random) -> None:
    # The tests judge with max_samples 40, max_gpus 6, max_events 3.
    if batch.get("samples"):
        batch["samples"] = (batch["samples"] * 41)[: rng.choice([40, 41, 50])]


MUTATIONS: dict[str, Callable[[Body, random.Random], None]] = {
    "replace_any_value": _replace_any_value,
    "delete_any_member": _delete_any_member,
    "add_unknown_member": _add_unknown_member,
    "retime": _retime,
    "repeat_sample": _repeat_sample,
    "repeat_gpu": _repeat_gpu,
    "deep_details": _deep_details,
    "judged_details": _judged_details,
    "text_no_database_stores": _text_no_database_stores,
    "odd_labels": _odd_labels,
    "over_limits": _over_limits,
}


def _duplicate_key(body: bytes, rng: random.Random) -> bytes:
    """Repeat one member inside its object: ``{"a": 1, ...}`` -> ``{"a": 2, "a": 1, ...}``."""
    key = rng.choice([b'"gpu_temp_c": ', b'"name": ', b'"ts": ', b'"uuid": ', b'"xid": '])
    at = body.find(key)
    if at < 0:
        return body
    value = rng.choice([b'"x", ', b"1, ", b"null, ", b"true, ", b"[], "])
    return body[:at] + key + value + body[at:]


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "truncate": lambda b, rng: b[: rng.randrange(len(b))],
    "trailing_garbage": lambda b, rng: b + rng.choice([b"x", b" {}", b"\x00", b"\n\n"]),
    "bom": lambda b, rng: b"\xef\xbb\xbf" + b,
    "whitespace": lambda b, rng: b" \n\t" + b + b"\r\n",
    "invalid_utf8": lambda b, rng: b.replace(
        b"node", rng.choice([b"n\xffde", b"n\xc0\xafe", b"n\xed\xa0\x80e"]), 1
    ),
    "utf8_text": lambda b, rng: b.replace(b"NVIDIA", "NVİDİA \U0001f600".encode(), 1),
    "duplicate_key": _duplicate_key,
    "not_an_object": lambda b, rng: rng.choice([b"[]", b"null", b"1", b'"batch"', b"", b"{}"]),
    "escaped_key": lambda b, rng: b.replace(b'"batch_id"', b'"batch\\u005fid"', 1),
}  # fmt: skip
