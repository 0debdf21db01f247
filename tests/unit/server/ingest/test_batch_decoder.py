"""The ingest hot path against the wire format's pydantic models, on a generated corpus.

For every body, valid or hostile (tests/unit/server/ingest/wire_corpus.py):

- the fast path (msgspec + checks) never accepts a body the pydantic models refuse, and what it
  accepts decodes to the same values, type for type (an int is not a float, -0.0 is not 0.0, a
  time is the same instant in the same zone);
- :func:`decode_batch`, what the server runs, answers exactly what the old path answered
  (``Batch.model_validate_json``, its 422 built as before, then the duplicate-sample check): the
  same batch, or an :class:`InvalidInput` with the same message and the same ``detail`` (each
  ``loc`` and ``msg``);
- and the bodies agents send take the fast path (else it would not be one).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from msgspec import Struct
from pydantic import BaseModel
from tests.unit.server.ingest.wire_corpus import (
    BYTE_MUTATIONS,
    MUTATIONS,
    NOW,
    encode,
    valid_batch,
)

from fleetwatch.errors import InvalidInput
from fleetwatch.server.ingest.batch_decoder import (
    decode_batch,
    decode_fast,
    structs_of,
    validate_with_models,
)
from fleetwatch.server.ingest.checks import collapse_duplicate_samples
from fleetwatch.telemetry import IngestLimits

LIMITS = IngestLimits(now=NOW)
# Small enough that the corpus crosses them (wire_corpus._over_limits).
TIGHT = replace(LIMITS, max_gpus=6, max_samples=40, max_events=3)


def plain(value: Any) -> Any:
    """``value`` as nested builtins, each scalar tagged with its type, for exact comparison."""
    if isinstance(value, Struct):
        return {name: plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, BaseModel):
        return {name: plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {key: plain(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [plain(inner) for inner in value]
    if isinstance(value, datetime):
        return ("datetime", value.isoformat(), value.tzinfo is not None and value.utcoffset())
    return (type(value).__name__, repr(value))


def old_path(body: bytes, limits: IngestLimits) -> Any:
    """What the server answered before the fast path: the pydantic models decide everything."""
    try:
        model = validate_with_models(body, limits)
    except InvalidInput as exc:
        return ("422", str(exc), exc.detail)
    try:
        return ("ok", plain(collapse_duplicate_samples(structs_of(model))))
    except InvalidInput as exc:
        return ("422", str(exc), exc.detail)


def new_path(body: bytes, limits: IngestLimits) -> Any:
    try:
        return ("ok", plain(decode_batch(body, limits)))
    except InvalidInput as exc:
        return ("422", str(exc), exc.detail)


def check(body: bytes, limits: IngestLimits = LIMITS) -> tuple[bool, bool, bool]:
    """Compare the paths on ``body``; return whether it was stored (200), whether the models
    accept it, and whether the fast path vouched for it."""
    try:
        model = validate_with_models(body, limits)
    except InvalidInput:
        model = None
    if model is not None:  # what the slow path hands storage holds what pydantic validated
        assert plain(structs_of(model)) == plain(model)
    fast = decode_fast(body, limits)
    if fast is not None:
        assert model is not None, f"fast path accepted a body pydantic refuses: {body[:300]!r}"
        assert plain(fast) == plain(model), f"values differ for {body[:300]!r}"
    answer = new_path(body, limits)
    assert answer == old_path(body, limits), body[:300]
    return answer[0] == "ok", model is not None, fast is not None


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    # Seeded by the test's name: a failure reproduces by running the same test again.
    return random.Random(zlib.crc32(request.node.name.encode()))


def test_decoder_valid_corpus_takes_the_fast_path_with_the_same_values(rng: random.Random) -> None:
    for _ in range(400):
        body = encode(valid_batch(rng))
        stored, accepted, vouched = check(body)
        assert stored and accepted, body[:300]
        assert vouched, f"a valid agent batch missed the fast path: {body[:300]!r}"


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_decoder_mutated_corpus_answers_as_the_models_do(rng: random.Random, mutation: str) -> None:
    refused = 0
    for _ in range(150):
        batch = valid_batch(rng)
        MUTATIONS[mutation](batch, rng)
        stored, _, _ = check(encode(batch), TIGHT if mutation == "over_limits" else LIMITS)
        refused += not stored
    assert refused > 0, "the mutation never made a body the server refuses: it tests nothing"


@pytest.mark.parametrize("mutation", sorted(BYTE_MUTATIONS))
def test_decoder_damaged_bytes_answer_as_the_models_do(rng: random.Random, mutation: str) -> None:
    for _ in range(60):
        check(BYTE_MUTATIONS[mutation](encode(valid_batch(rng)), rng))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"null",
        b'{"batch_id": "b", "node": {"name": "n"}, "samples": [' + b"[" * 300 + b"]" * 300 + b"]}",
        b'{"batch_id": "b", "node": {"name": "n", "name": "m"}}',
        b'{"batch_id": "b", "node": {"name": "n\\u0000"}}',
        b'{"batch_id": "b\\n", "node": {"name": "n"}}',
        b'{"batch_id": "b", "node": {"name": "n\\n"}}',
        b'{"batch_id": "b", "node": {"name": "n", "labels": {"a": "\\ud83d\\ude00"}}}',
        b'{"batch_id": "b", "node": {"name": "n", "interval_s": 1e999}}',
        b'{"batch_id": "b", "node": {"name": "n", "interval_s": 3600.0000000000005}}',
        b'{"batch_id": "b", "node": {"name": "n", "interval_s": 5e-324}}',
    ],
)
def test_decoder_hand_picked_bodies_answer_as_the_models_do(body: bytes) -> None:
    check(body)


def _one_sample(**values: Any) -> bytes:
    sample = {"uuid": "GPU-1", "ts": NOW.isoformat(), **values}
    gpu = {"uuid": "GPU-1", "index": 0}
    batch = {"batch_id": "b", "node": {"name": "n"}, "gpus": [gpu], "samples": [sample]}
    return encode(batch)


@pytest.mark.parametrize(
    "values",
    [
        {"fb_used_mib": 9007199254740993},  # an int a float cannot hold exactly
        {"fb_used_mib": 2**70},
        {"fb_used_mib": "@huge@"},  # 5,000 digits where a float goes
        {"fb_total_mib": 1.7976931348623157e308},
        {"fb_total_mib": 5e-324, "power_w": 2.2250738585072014e-308},
        {"gpu_temp_c": -50, "memory_temp_c": 200.0, "fan_speed_pct": 100},
        {"gpu_temp_c": -50.00000000000001},
        {"energy_mj": 2**63 - 1, "clocks_event_reasons": 0},
        {"pcie_link_gen": 0},
        {"remapped_rows_pending": None, "gpu_temp_c": None},
    ],
)
def test_decoder_numbers_at_their_edges_answer_as_the_models_do(values: dict[str, Any]) -> None:
    check(_one_sample(**values))


def test_decoder_details_nesting_is_left_to_the_models_near_their_limit() -> None:
    # pydantic's parser stops at a depth of about 200; the fast path vouches only far below it.
    answers = []
    for depth in range(55, 205, 5):
        deep: Any = 1
        for _ in range(depth):
            deep = [deep]
        event = {"kind": "agent_start", "ts": NOW.isoformat(), "details": {"d": deep}}
        batch = {"batch_id": "b", "node": {"name": "n"}, "events": [event]}
        answers.append(check(json.dumps(batch).encode()))
    # Vouched for, left to pydantic and accepted, and refused: all three happen.
    assert {(True, True, True), (True, True, False), (False, False, False)} <= set(answers)


def test_decoder_refusal_is_the_models_422_word_for_word() -> None:
    batch = valid_batch(random.Random(7))
    batch["samples"] = batch.get("samples") or []
    batch["samples"].append({"uuid": "GPU-1", "ts": "soon", "gpu_temp_c": "hot"})
    body = encode(batch)
    with pytest.raises(InvalidInput) as new:
        decode_batch(body, LIMITS)
    with pytest.raises(InvalidInput) as old:
        validate_with_models(body, LIMITS)
    assert str(new.value) == str(old.value) and new.value.detail == old.value.detail
    assert {tuple(d["loc"][-1:]) for d in new.value.detail} == {("ts",), ("gpu_temp_c",)}


def test_decoder_vouches_for_no_timestamp_outside_the_limits() -> None:
    event = {"kind": "agent_start", "ts": (NOW + timedelta(minutes=5)).isoformat()}
    body = json.dumps({"batch_id": "b", "node": {"name": "n"}, "events": [event]}).encode()
    assert check(body) == (True, True, True)
    later = replace(LIMITS, now=NOW - timedelta(microseconds=1))
    assert check(body, later) == (False, False, False)


def test_a_batch_declaring_a_mig_layout_is_left_to_pydantic_and_keeps_its_layout() -> None:
    import json
    from datetime import UTC, datetime

    from fleetwatch.config import ServerSettings
    from fleetwatch.server.ingest.batch_decoder import decode_batch, decode_fast, ingest_limits
    from fleetwatch.telemetry import BATCH_EXAMPLE

    batch = json.loads(json.dumps(BATCH_EXAMPLE))
    batch["gpus"][0]["mig"] = {"current": "enabled", "instances": [{"gpu_instance_id": 1}]}
    body = json.dumps(batch).encode()
    limits = ingest_limits(ServerSettings(), datetime(2026, 11, 30, 5, 1, tzinfo=UTC))
    assert decode_fast(body, limits) is None
    decoded = decode_batch(body, limits)
    assert decoded.gpus[0].mig == {"current": "enabled", "instances": [{"gpu_instance_id": 1}]}


@pytest.mark.parametrize(
    ("event", "where"),
    [
        ({"kind": "mce", "details": {"severity": "deferred", "bank": [1]}}, "details.bank"),
        ({"kind": "sxid", "details": {"severity": "fatal", "sxid": [12028]}}, "details.sxid"),
        ({"kind": "pcie_aer", "details": {"errors": ["RxErr", 3]}}, "details.errors.1"),
        ({"kind": "edac", "details": {"count": 2**63 - 1}}, "details.count"),
    ],
)
def test_decoder_details_the_rules_cannot_read_are_refused_naming_the_field(
    event: dict[str, Any], where: str
) -> None:
    """Issue 35: both paths refuse details the rules cannot read; the 422 names the key."""
    batch = {"batch_id": "b", "node": {"name": "n"}, "events": [{**event, "ts": NOW.isoformat()}]}
    body = encode(batch)
    assert decode_fast(body, LIMITS) is None
    with pytest.raises(InvalidInput) as refused:
        decode_batch(body, LIMITS)
    assert str(refused.value).startswith(f"invalid batch: body.events.0.{where}: must be ")
    path = [int(p) if p.isdigit() else p for p in where.split(".")]
    assert refused.value.detail[0]["loc"] == ["body", "events", 0, *path]
    check(body)
