"""POST /v1/ingest with values one database would refuse or change: refused with 422 naming the
field, nothing of the batch stored, and the same and other nodes' next batches stored as usual.

NUL characters and lone UTF-16 surrogates in text, integers beyond 64 bits, NaN / Infinity /
1e999, and timestamps from year 1 answered 500 on PostgreSQL or were stored as something else on
SQLite before. Every test runs on SQLite and on real PostgreSQL (the ``client`` fixture).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.server.db.session import Database

Mutation = Callable[[dict[str, Any]], None]

# Literals json.dumps cannot write: swapped in for their placeholder after dumping.
RAW = {
    '"@1e999@"': "1e999",
    '"@-1e999@"': "-1e999",
    '"@huge@"': "1" + "0" * 5000,
}


def _body(batch: dict[str, Any]) -> bytes:
    text = json.dumps(
        batch
    )  # NaN -> NaN, inf -> Infinity, "\ud800" -> "\\ud800", "\0" -> "\\u0000"
    for placeholder, literal in RAW.items():
        text = text.replace(placeholder, literal)
    return text.encode()


def _refused(response: httpx.Response, status: int, loc: list[Any]) -> dict[str, Any]:
    """The uniform error body, with a detail entry exactly at ``loc``."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert isinstance(body["error"], str) and "nothing was stored" in body["error"]
    assert all(isinstance(d["msg"], str) and d["msg"] for d in body["detail"])
    locs = [d["loc"] for d in body["detail"]]
    assert loc in locs, f"no detail at {loc}: {locs}"
    return body


def _event(**fields: Any) -> dict[str, Any]:
    return {"kind": "agent_start", "ts": datetime.now(UTC).isoformat(), **fields}


def _set(*path: Any, value: Any) -> Mutation:
    """Set ``batch[path...] = value``; an event is added first when the path goes into events."""

    def mutate(batch: dict[str, Any]) -> None:
        if path[0] == "events" and not batch["events"]:
            batch["events"] = [_event(details={"source": "kmsg"})]
        target = batch
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _details(details: dict[str, Any]) -> Mutation:
    def mutate(batch: dict[str, Any]) -> None:
        batch["events"] = [_event(details=details)]

    return mutate


@pytest.fixture
def baseline(push: Push, db: Database) -> dict[str, int]:
    """node-a and node-b stored once each, so that 'nothing stored' compares non-zero counts."""
    for node in ("node-a", "node-b"):
        assert push(make_batch(node, gpus=2)).status_code == 200
    return row_counts(db)


def _fresh() -> dict[str, Any]:
    return make_batch("node-a", gpus=2)


def _after_refusal_normal_batches_are_stored(push: Push, db: Database) -> None:
    """The poisoned batch blocks nothing: node-a's and node-b's next batches are stored."""
    before = row_counts(db)
    for node in ("node-a", "node-b"):
        response = push(make_batch(node, gpus=2, events=[_event(message="normal")]))
        assert response.status_code == 200, response.text
        assert response.json()["duplicate"] is False
    after = row_counts(db)
    assert after["gpu_samples"] == before["gpu_samples"] + 4
    assert after["events"] == before["events"] + 2
    assert after["ingest_batches"] == before["ingest_batches"] + 2


def _check_refused(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> dict[str, Any]:
    batch = _fresh()
    mutate(batch)
    body = _refused(push(_body(batch)), 422, ["body", *loc])
    assert row_counts(db) == baseline
    _after_refusal_normal_batches_are_stored(push, db)
    return body


# -- text: NUL and lone surrogates in every free-text field ---------------------------------

TEXT_PATHS: list[list[Any]] = [
    ["node", "labels", "rack"],
    ["node", "agent_version"],
    ["node", "boot_id"],
    ["gpus", 0, "serial"],
    ["gpus", 0, "name"],
    ["gpus", 1, "driver_version"],
    ["gpus", 0, "vbios_version"],
    ["events", 0, "message"],
    ["events", 0, "process"],
    ["events", 0, "details", "comm"],
]


def _text_cases(bad: str, label: str) -> list[Any]:
    cases = [
        pytest.param(_set(*loc, value=f"x{bad}y"), loc, id=f"{label}-{'.'.join(map(str, loc))}")
        for loc in TEXT_PATHS
    ]
    nested = ["events", 0, "details", "a", 1, "b"]
    cases.append(pytest.param(_details({"a": [1, {"b": bad}]}), nested, id=f"{label}-nested"))
    # The answer shows a key's lone surrogate escaped: it cannot be written in UTF-8.
    key = "k" + bad.encode("utf-8", "backslashreplace").decode()
    cases.append(
        pytest.param(
            _details({"k" + bad: 1}), ["events", 0, "details", key, "[key]"], id=f"{label}-key"
        )
    )
    return cases


@pytest.mark.parametrize(("mutate", "loc"), _text_cases("\x00", "nul"))
def test_ingest_nul_in_any_text_field_is_422_naming_it(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> None:
    body = _check_refused(push, db, baseline, mutate, loc)
    assert any("NUL" in d["msg"] for d in body["detail"])


@pytest.mark.parametrize(("mutate", "loc"), _text_cases("\ud800", "surrogate"))
def test_ingest_lone_surrogate_in_any_text_field_is_422_naming_it(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> None:
    body = _check_refused(push, db, baseline, mutate, loc)
    assert any("surrogate" in d["msg"] for d in body["detail"])


def test_ingest_surrogate_pair_is_text_and_stored(push: Push, read: Callable[..., Any]) -> None:
    # "\ud83d\ude00" is one character (an emoji) written as a pair: valid, and stored as such.
    batch = make_batch("node-a", gpus=1, events=[_event(message="ok \U0001f600")])
    text = json.dumps(batch)
    assert "\\ud83d\\ude00" in text
    assert push(text.encode()).status_code == 200
    events = read("/v1/events", node="node-a").json()["data"]
    assert events[0]["message"] == "ok \U0001f600"


@pytest.mark.parametrize(
    ("mutate", "loc"),
    [
        pytest.param(_set("node", "name", value="node-\x00"), ["node", "name"], id="node_name"),
        pytest.param(_set("batch_id", value="b\x00"), ["batch_id"], id="batch_id"),
        pytest.param(_set("events", 0, "kind", value="xid\x00"), ["events", 0, "kind"], id="kind"),
        pytest.param(
            _set("node", "labels", value={"rack\x00": "r"}), ["node", "labels"], id="label_key"
        ),
        pytest.param(
            _set("gpus", 0, "pci_bus_id", value="0000:18:00.0\x00"),
            ["gpus", 0, "pci_bus_id"],
            id="pci_bus_id",
        ),
        pytest.param(
            _set("node", "labels", value={"rack\n": "r"}),
            ["node", "labels"],
            id="label_key_newline",
        ),
    ],
)
def test_ingest_nul_in_a_patterned_field_is_422(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> None:
    _check_refused(push, db, baseline, mutate, loc)


def test_ingest_overlong_text_is_422_without_echoing_it(
    push: Push, db: Database, baseline: dict[str, int]
) -> None:
    huge = "z" * 100_000
    body = _check_refused(
        push, db, baseline, _set("gpus", 0, "pci_bus_id", value=huge), ["gpus", 0, "pci_bus_id"]
    )
    assert len(json.dumps(body)) < 2_000
    batch = _fresh()
    batch["node"]["labels"] = {huge: "r"}
    response = push(_body(batch))
    assert len(_refused(response, 422, ["body", "node", "labels"])["error"]) < 500


# -- numbers: beyond 64 bits, NaN, Infinity ---------------------------------------------------

INT_CASES = [
    pytest.param(_set("samples", 0, "energy_mj", value=2**63), ["samples", 0, "energy_mj"],
                 id="counter_2_63"),
    pytest.param(_set("samples", 1, "ecc_dbe_volatile_total", value=2**64 + 7),
                 ["samples", 1, "ecc_dbe_volatile_total"], id="counter_2_64"),
    pytest.param(_set("samples", 0, "pcie_replay_total", value=10**30),
                 ["samples", 0, "pcie_replay_total"], id="counter_10_30"),
    pytest.param(_set("samples", 0, "clocks_event_reasons", value=2**64),
                 ["samples", 0, "clocks_event_reasons"], id="bitmask_2_64"),
    pytest.param(_set("samples", 0, "gpu_recovery_action", value=2**63),
                 ["samples", 0, "gpu_recovery_action"], id="recovery_action"),
    pytest.param(_set("samples", 0, "pcie_link_width", value=2**63),
                 ["samples", 0, "pcie_link_width"], id="link_width"),
    pytest.param(_set("gpus", 0, "index", value=2**63), ["gpus", 0, "index"], id="gpu_index"),
    pytest.param(_set("events", 0, "pid", value=2**63), ["events", 0, "pid"], id="pid"),
    pytest.param(_set("events", 0, "xid", value=2**63), ["events", 0, "xid"], id="xid"),
    pytest.param(_details({"n": 2**63}), ["events", 0, "details", "n"], id="details_2_63"),
    pytest.param(_details({"n": [-(2**63) - 1]}), ["events", 0, "details", "n", 0],
                 id="details_below_int64"),
    pytest.param(_set("samples", 0, "energy_mj", value="@huge@"), ["samples", 0, "energy_mj"],
                 id="counter_5000_digits"),
    pytest.param(_details({"n": "@huge@"}), ["events", 0, "details", "n"],
                 id="details_5000_digits"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "loc"), INT_CASES)
def test_ingest_integer_beyond_its_column_is_422_naming_it(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> None:
    _check_refused(push, db, baseline, mutate, loc)


def test_ingest_largest_int64_counter_is_stored(push: Push, read: Callable[..., Any]) -> None:
    batch = make_batch("node-a", gpus=1)
    batch["samples"][0]["energy_mj"] = 2**63 - 1
    batch["events"] = [_event(details={"n": 2**63 - 1, "m": -(2**63)})]
    assert push(batch).status_code == 200
    gpu = read(f"/v1/gpus/{gpu_uuid('node-a', 0)}").json()
    assert gpu["latest"]["values"]["energy_mj"] == 2**63 - 1
    event = read("/v1/events", node="node-a").json()["data"][0]
    assert event["details"] == {"n": 2**63 - 1, "m": -(2**63)}


NON_FINITE = [
    ("nan", float("nan")),
    ("infinity", float("inf")),
    ("minus_infinity", float("-inf")),
    ("1e999", "@1e999@"),
    ("minus_1e999", "@-1e999@"),
]
FLOAT_PATHS: list[list[Any]] = [
    ["samples", 0, "fb_used_mib"],
    ["samples", 1, "fb_total_mib"],
    ["samples", 0, "gpu_temp_c"],
    ["samples", 0, "power_w"],
    ["node", "interval_s"],
]


def _float_cases() -> list[Any]:
    cases = []
    for label, value in NON_FINITE:
        for loc in FLOAT_PATHS:
            cases.append(pytest.param(_set(*loc, value=value), loc, id=f"{loc[-1]}-{label}"))
        in_details = ["events", 0, "details", "temp", 1]
        cases.append(
            pytest.param(_details({"temp": [1.5, value]}), in_details, id=f"details-{label}")
        )
    return cases


@pytest.mark.parametrize(("mutate", "loc"), _float_cases())
def test_ingest_nan_or_infinity_is_422_naming_the_field(
    push: Push, db: Database, baseline: dict[str, int], mutate: Mutation, loc: list[Any]
) -> None:
    _check_refused(push, db, baseline, mutate, loc)


# -- timestamps: the past needs a bound as the future has one ---------------------------------

OLD_TIMES = {
    "year_1": "0001-01-01T00:00:00Z",
    "year_1_east": "0001-01-01T00:00:00+14:00",  # before year 1 in UTC
    "year_9999_west": "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
    "year_1900": "1900-01-01T00:00:00Z",
    "epoch": "1970-01-01T00:00:00Z",
}


@pytest.mark.parametrize("stamp", sorted(OLD_TIMES))
@pytest.mark.parametrize("where", ["sample", "event"])
def test_ingest_timestamp_far_in_the_past_is_422(
    push: Push, db: Database, baseline: dict[str, int], stamp: str, where: str
) -> None:
    mutate = (
        _set("samples", 1, "ts", value=OLD_TIMES[stamp])
        if where == "sample"
        else _set("events", 0, "ts", value=OLD_TIMES[stamp])
    )
    loc = ["samples", 1, "ts"] if where == "sample" else ["events", 0, "ts"]
    body = _check_refused(push, db, baseline, mutate, loc)
    assert "clock" in body["error"] or "range" in body["error"]


def test_ingest_past_age_limit_is_a_setting(
    push: Push, make_client: Callable[..., TestClient], db: Database
) -> None:
    strict = make_client(max_past_age_s=3600)
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    old = make_batch("node-a", gpus=1, start=two_hours_ago)
    body = _refused(push(old, on=strict), 422, ["body", "samples", 0, "ts"])
    assert "max_past_age_s" in body["error"] and "up to 3600 s old" in body["error"]
    assert row_counts(db)["gpu_samples"] == 0
    # The default (30 days) keeps a spool's days of outage: the same batch is accepted.
    assert push(old).status_code == 200


def test_ingest_spooled_batch_from_29_days_ago_is_accepted(push: Push, db: Database) -> None:
    old = make_batch("node-a", gpus=1, start=datetime.now(UTC) - timedelta(days=29))
    assert push(old).status_code == 200
    assert row_counts(db)["gpu_samples"] == 1
