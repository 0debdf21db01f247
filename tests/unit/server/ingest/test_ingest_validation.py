"""POST /v1/ingest: what is refused, with which status and field, and that nothing of it is stored.

Every test runs on the embedded SQLite file and on real PostgreSQL (the ``client`` fixture).
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.server.db.session import Database

Mutation = Callable[[dict[str, Any]], None]


def _assert_error(response: Any, status: int, loc: list[Any]) -> dict[str, Any]:
    """The uniform error body: a non-empty ``error`` and a ``detail`` entry at ``loc``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    locs = [d["loc"] for d in body["detail"]]
    assert all(isinstance(d["msg"], str) and d["msg"] for d in body["detail"])
    assert any(found[: len(loc)] == loc for found in locs), f"no detail at {loc}: {locs}"
    return body


@pytest.fixture
def stored(push: Push, db: Database) -> dict[str, Any]:
    """node-a with two GPUs and one stored batch, so that 'unchanged' counts are not all zero."""
    batch = make_batch("node-a", gpus=2, ticks=2)
    assert push(batch).status_code == 200
    return {"batch": batch, "counts": row_counts(db)}


def _fresh(**kwargs: Any) -> dict[str, Any]:
    return make_batch("node-a", gpus=2, ticks=1, **kwargs)


# -- idempotency -----------------------------------------------------------------------------


def test_ingest_replay_of_same_batch_is_acknowledged_and_stored_once(
    push: Push, db: Database
) -> None:
    batch = make_batch("node-a", gpus=2, ticks=3)
    first = push(batch)
    assert first.status_code == 200, first.text
    assert first.json() == {"accepted": {"samples": 6, "events": 0}, "duplicate": False}
    counts = row_counts(db)
    assert counts["gpu_samples"] == 6 and counts["ingest_batches"] == 1

    again = push(batch)
    assert again.status_code == 200, again.text
    assert again.json() == {"accepted": {"samples": 0, "events": 0}, "duplicate": True}
    assert row_counts(db) == counts


def test_ingest_replay_gzipped_is_still_a_duplicate(push: Push, db: Database) -> None:
    batch = make_batch("node-a", gpus=1, ticks=2)
    assert push(batch).json()["duplicate"] is False
    counts = row_counts(db)
    zipped = gzip.compress(json.dumps(batch).encode())
    again = push(zipped, headers={"Content-Encoding": "gzip"})
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    assert row_counts(db) == counts


def test_ingest_replay_with_xid_event_stores_the_event_once(push: Push, db: Database) -> None:
    uuid = gpu_uuid("node-a", 0)
    event = {"kind": "xid", "uuid": uuid, "xid": 79, "ts": datetime.now(UTC).isoformat()}
    batch = make_batch("node-a", gpus=1, events=[event])
    assert push(batch).json() == {"accepted": {"samples": 1, "events": 1}, "duplicate": False}
    assert push(batch).json() == {"accepted": {"samples": 0, "events": 0}, "duplicate": True}
    assert row_counts(db)["events"] == 1


def test_ingest_same_batch_id_with_other_content_is_a_conflict(
    push: Push, db: Database, stored: dict[str, Any]
) -> None:
    changed = copy.deepcopy(stored["batch"])
    changed["samples"][0]["gpu_temp_c"] = 99.0
    response = push(changed)
    body = _assert_error(response, 409, ["body", "batch_id"])
    assert stored["batch"]["batch_id"] in body["error"]
    assert row_counts(db) == stored["counts"]


# -- encodings and media types ---------------------------------------------------------------


def test_ingest_gzip_body_is_accepted(push: Push, db: Database) -> None:
    batch = make_batch("node-a", gpus=2, ticks=2)
    response = push(gzip.compress(json.dumps(batch).encode()), headers={"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": {"samples": 4, "events": 0}, "duplicate": False}
    assert row_counts(db)["gpu_samples"] == 4


def test_ingest_content_type_with_charset_is_accepted(push: Push) -> None:
    response = push(make_batch(), headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 200, response.text


def test_ingest_invalid_gzip_is_422(push: Push, stored: dict[str, Any], db: Database) -> None:
    response = push(b"this is not gzip at all", headers={"Content-Encoding": "gzip"})
    body = _assert_error(response, 422, ["body"])
    assert "gzip" in body["error"]
    assert row_counts(db) == stored["counts"]


def _zipped_batch() -> bytes:
    return gzip.compress(json.dumps(_fresh()).encode())


BROKEN_GZIP = {
    # A stream cut before its CRC and length trailer inflates to the whole JSON, unchecked.
    "no_trailer": lambda: _zipped_batch()[:-8],
    "half_trailer": lambda: _zipped_batch()[:-3],
    "cut_in_data": lambda: _zipped_batch()[:40],
    "bad_crc": lambda: _zipped_batch()[:-8] + b"\0" * 8,
    "trailing_bytes": lambda: _zipped_batch() + b"junk",
    # A second member would be silently dropped; refusing it is the honest answer.
    "second_member": lambda: _zipped_batch() + gzip.compress(b" "),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_GZIP))
def test_ingest_damaged_gzip_is_422(
    push: Push, stored: dict[str, Any], db: Database, broken: str
) -> None:
    response = push(BROKEN_GZIP[broken](), headers={"Content-Encoding": "gzip"})
    assert response.status_code == 422, response.text
    _assert_error(response, 422, ["body"])
    assert row_counts(db) == stored["counts"]


@pytest.mark.parametrize("encoding", ["br", "deflate", "compress"])
def test_ingest_unsupported_content_encoding_is_415(
    push: Push, stored: dict[str, Any], db: Database, encoding: str
) -> None:
    response = push(_fresh(), headers={"Content-Encoding": encoding})
    body = _assert_error(response, 415, ["header", "content-encoding"])
    assert encoding in body["error"]
    assert row_counts(db) == stored["counts"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_ingest_unsupported_content_type_is_415(
    push: Push, stored: dict[str, Any], db: Database, content_type: str
) -> None:
    response = push(_fresh(), headers={"Content-Type": content_type})
    body = _assert_error(response, 415, ["header", "content-type"])
    assert content_type in body["error"]
    assert row_counts(db) == stored["counts"]


def test_ingest_malformed_json_is_422(push: Push, stored: dict[str, Any], db: Database) -> None:
    response = push(b'{"batch_id": "x", "node": {"name": ')
    body = _assert_error(response, 422, ["body"])
    assert "JSON" in body["detail"][0]["msg"]
    assert row_counts(db) == stored["counts"]


# -- field validation: each bad batch names its field and stores nothing -----------------------


def _value(value: Any) -> Any:
    """Values that depend on the clock are given as callables and computed when the test runs."""
    return value() if callable(value) else value


def _set_sample(field: str, value: Any) -> Mutation:
    def mutate(batch: dict[str, Any]) -> None:
        batch["samples"][0][field] = _value(value)

    return mutate


def _set_node(field: str, value: Any) -> Mutation:
    def mutate(batch: dict[str, Any]) -> None:
        batch["node"][field] = value

    return mutate


def _set_gpu(field: str, value: Any) -> Mutation:
    def mutate(batch: dict[str, Any]) -> None:
        batch["gpus"][0][field] = value

    return mutate


def _add_event(**event: Any) -> Mutation:
    def mutate(batch: dict[str, Any]) -> None:
        given = {key: _value(value) for key, value in event.items()}
        batch["events"] = [{"ts": datetime.now(UTC).isoformat(), **given}]

    return mutate


def _unknown_sample_gpu(batch: dict[str, Any]) -> None:
    batch["samples"][0]["uuid"] = "GPU-00000000-0000-0000-0000-000000000bad"


def _future(minutes: float) -> Callable[[], str]:
    return lambda: (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


def _naive_now() -> str:
    return datetime.now(UTC).replace(tzinfo=None).isoformat()


INVALID = [
    ("string_temperature", _set_sample("gpu_temp_c", "41"), ["samples", 0, "gpu_temp_c"]),
    ("bool_temperature", _set_sample("gpu_temp_c", True), ["samples", 0, "gpu_temp_c"]),
    (
        "float_counter",
        _set_sample("ecc_dbe_volatile_total", 1.5),
        ["samples", 0, "ecc_dbe_volatile_total"],
    ),
    ("whole_float_counter", _set_sample("energy_mj", 2.0), ["samples", 0, "energy_mj"]),
    (
        "int_for_flag",
        _set_sample("remapped_rows_pending", 1),
        ["samples", 0, "remapped_rows_pending"],
    ),
    (
        "string_for_flag",
        _set_sample("remapped_rows_failure", "false"),
        ["samples", 0, "remapped_rows_failure"],
    ),
    ("negative_counter", _set_sample("pcie_replay_total", -1), ["samples", 0, "pcie_replay_total"]),
    (
        "negative_ecc",
        _set_sample("ecc_sbe_volatile_total", -5),
        ["samples", 0, "ecc_sbe_volatile_total"],
    ),
    ("percent_over_100", _set_sample("gpu_util_pct", 101.0), ["samples", 0, "gpu_util_pct"]),
    ("unknown_sample_field", _set_sample("gpu_temp_f", 100.0), ["samples", 0, "gpu_temp_f"]),
    ("future_sample_ts", _set_sample("ts", _future(10)), ["samples", 0, "ts"]),
    ("naive_sample_ts", _set_sample("ts", _naive_now), ["samples", 0, "ts"]),
    ("sample_ts_not_a_time", _set_sample("ts", "yesterday"), ["samples", 0, "ts"]),
    ("bad_sample_uuid", _set_sample("uuid", "not-a-gpu-uuid"), ["samples", 0, "uuid"]),
    ("unknown_sample_gpu", _unknown_sample_gpu, ["samples", 0, "uuid"]),
    ("bad_node_name", _set_node("name", "bad name!"), ["node", "name"]),
    ("empty_node_name", _set_node("name", ""), ["node", "name"]),
    ("bad_label_key", _set_node("labels", {"rack-id": "r1"}), ["node", "labels"]),
    ("label_key_digit_first", _set_node("labels", {"1rack": "r1"}), ["node", "labels"]),
    ("zero_interval", _set_node("interval_s", 0), ["node", "interval_s"]),
    ("unknown_node_field", _set_node("hostname", "x"), ["node", "hostname"]),
    ("bad_pci_bus_id", _set_gpu("pci_bus_id", "zz:00"), ["gpus", 0, "pci_bus_id"]),
    (
        "pci_function_out_of_range",
        _set_gpu("pci_bus_id", "0000:3b:00.9"),
        ["gpus", 0, "pci_bus_id"],
    ),
    ("negative_gpu_index", _set_gpu("index", -1), ["gpus", 0, "index"]),
    ("xid_without_code", _add_event(kind="xid", uuid=gpu_uuid("node-a", 0)), ["events", 0]),
    (
        "event_bad_pci",
        _add_event(kind="gpu_lost", pci_bus_id="nonsense"),
        ["events", 0, "pci_bus_id"],
    ),
    ("event_future_ts", _add_event(kind="agent_start", ts=_future(10)), ["events", 0, "ts"]),
    ("event_naive_ts", _add_event(kind="agent_start", ts=_naive_now), ["events", 0, "ts"]),
    ("event_bad_kind", _add_event(kind="Bad Kind"), ["events", 0, "kind"]),
    (
        "unknown_event_gpu",
        _add_event(kind="xid", xid=79, uuid="GPU-00000000-0000-0000-0000-000000000bad"),
        ["events", 0, "uuid"],
    ),
    ("bad_batch_id", lambda b: b.update(batch_id="has spaces/and slashes"), ["batch_id"]),
    ("missing_node", lambda b: b.pop("node"), ["node"]),
    ("unknown_top_level_field", lambda b: b.update(version=2), ["version"]),
]


@pytest.mark.parametrize(("mutate", "loc"), [pytest.param(m, loc, id=i) for i, m, loc in INVALID])
def test_ingest_invalid_batch_names_the_field_and_stores_nothing(
    push: Push, db: Database, stored: dict[str, Any], mutate: Mutation, loc: list[Any]
) -> None:
    batch = _fresh()
    mutate(batch)
    response = push(batch)
    body = _assert_error(response, 422, ["body", *loc])
    assert "nothing was stored" in body["error"]
    assert row_counts(db) == stored["counts"]


def test_ingest_invalid_batch_from_a_new_node_leaves_no_trace(
    push: Push,
    db: Database,
    stored: dict[str, Any],
    read: Callable[..., Any],
    client: TestClient,
    tokens: dict[str, str],
) -> None:
    # The node and its GPUs are written before the reference check fails: all must roll back.
    batch = make_batch("node-new", gpus=3, ticks=2, boot_id="boot-x")
    batch["samples"][-1]["uuid"] = "GPU-00000000-0000-0000-0000-000000000bad"
    response = push(batch)
    _assert_error(response, 422, ["body", "samples", 5, "uuid"])
    assert row_counts(db) == stored["counts"]
    names = [n["name"] for n in read("/v1/nodes").json()["data"]]
    assert names == ["node-a"]
    missing = client.get(f"/v1/gpus/{batch['gpus'][0]['uuid']}", headers=bearer(tokens["read"]))
    assert missing.status_code == 404


def test_ingest_sample_for_a_gpu_of_another_node_is_refused(
    push: Push, db: Database, stored: dict[str, Any]
) -> None:
    # node-a's GPU exists in the database, but node-b may not report it without declaring it.
    batch = make_batch("node-b", gpus=1)
    batch["samples"].append(make_sample(gpu_uuid("node-a", 0)))
    response = push(batch)
    body = _assert_error(response, 422, ["body", "samples", 1, "uuid"])
    assert gpu_uuid("node-a", 0) in json.dumps(body["detail"])
    assert row_counts(db) == stored["counts"]


def test_ingest_sample_for_a_gpu_known_to_the_node_needs_no_declaration(
    push: Push, db: Database, stored: dict[str, Any]
) -> None:
    batch = _fresh()
    batch["gpus"] = []
    response = push(batch)
    assert response.status_code == 200, response.text
    assert row_counts(db)["gpu_samples"] == stored["counts"]["gpu_samples"] + 2


def test_ingest_error_lists_every_problem(push: Push) -> None:
    batch = _fresh()
    batch["samples"][0]["gpu_temp_c"] = "hot"
    batch["samples"][1]["pcie_replay_total"] = -3
    response = push(batch)
    body = _assert_error(response, 422, ["body", "samples", 0, "gpu_temp_c"])
    _assert_error(response, 422, ["body", "samples", 1, "pcie_replay_total"])
    assert "1 more" in body["error"]


def test_ingest_timestamp_within_clock_skew_is_accepted(push: Push) -> None:
    batch = _fresh()
    batch["samples"][0]["ts"] = _future(2)()
    response = push(batch)
    assert response.status_code == 200, response.text


# -- limits ----------------------------------------------------------------------------------


@pytest.fixture
def small(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client(max_body_bytes=4096, max_samples_per_batch=3)


def test_ingest_body_over_limit_is_413(
    push: Push, small: TestClient, stored: dict[str, Any], db: Database
) -> None:
    big = make_batch("node-a", gpus=16, ticks=1)
    assert len(json.dumps(big)) > 4096
    body = _assert_error(push(big, on=small), 413, ["body"])
    assert "4096" in body["error"]
    assert row_counts(db) == stored["counts"]


def test_ingest_body_over_limit_without_content_length_is_413(
    small: TestClient, tokens: dict[str, str], stored: dict[str, Any], db: Database
) -> None:
    payload = json.dumps(make_batch("node-a", gpus=16)).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 1000):
            yield payload[start : start + 1000]

    response = small.post(
        "/v1/ingest",
        content=chunks(),
        headers={"Content-Type": "application/json", **bearer(tokens["agent"])},
    )
    _assert_error(response, 413, ["body"])
    assert row_counts(db) == stored["counts"]


def test_ingest_gzip_bomb_is_413(
    push: Push, small: TestClient, stored: dict[str, Any], db: Database
) -> None:
    # Tiny on the wire, far over the limit once inflated.
    bomb = gzip.compress(b'{"batch_id": "b", "pad": "' + b"0" * 1_000_000 + b'"}')
    assert len(bomb) < 4096
    response = push(bomb, headers={"Content-Encoding": "gzip"}, on=small)
    _assert_error(response, 413, ["body"])
    assert row_counts(db) == stored["counts"]


def test_ingest_gzip_under_limit_after_inflating_is_accepted(push: Push, small: TestClient) -> None:
    batch = make_batch("node-a", gpus=1, ticks=2)
    raw = json.dumps(batch).encode()
    assert len(raw) < 4096
    response = push(gzip.compress(raw), headers={"Content-Encoding": "gzip"}, on=small)
    assert response.status_code == 200, response.text


def test_ingest_too_many_samples_is_422(
    push: Push, small: TestClient, stored: dict[str, Any], db: Database
) -> None:
    batch = make_batch("node-a", gpus=1, ticks=4)
    body = _assert_error(push(batch, on=small), 422, ["body"])
    assert "too many samples: 4 > 3" in body["error"]
    assert row_counts(db) == stored["counts"]
