"""The leader's snapshot as bytes and back (what it shares with the other processes,
``test_snapshot_sharing.py``): every judgement, time, covariate and risk survives exactly; a
damaged body or another format is refused. On both databases."""

from __future__ import annotations

import json
import math
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from fastapi.testclient import TestClient
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _store_model, _xid_batch

from fleetwatch.config import ServerSettings
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.judge.snapshot_codec import (
    SnapshotFormatError,
    decode_snapshot,
    encode_snapshot,
)


def _verdict_view(v: Verdict) -> tuple[Any, ...]:
    # Evidence is JSON-shaped: compared as the JSON it is served as.
    evidence = json.dumps(v.evidence, sort_keys=True, default=str)
    return (v.kind, v.rule, v.severity, v.action, v.counts_against_gpu, v.source,
            v.first_seen, v.last_seen, v.xids, evidence, v.note)  # fmt: skip


def _view(snapshot: FleetAssessment) -> list[tuple[Any, ...]]:
    return [
        (g.uuid, g.node, g.index, g.serial, g.sku, g.installed_at, g.age_days, g.features,
         [_verdict_view(v) for v in g.verdicts])
        for g in snapshot.gpus
    ]  # fmt: skip


def _risks(snapshot: FleetAssessment) -> list[tuple[str, float | None, str]]:
    return [(r.gpu.uuid, r.probability, r.basis) for r in snapshot.risks(1.0)]


def _assessor(db: Database, settings: ServerSettings) -> Assessor:
    return Assessor(db, settings, XidCatalog.load(), HealthThresholds())


def test_codec_round_trip_keeps_every_judgement_and_the_risks(
    client: TestClient, push: Push, db: Database, settings: ServerSettings
) -> None:
    """Xid and health verdicts with their evidence, a targeted patch's times, the model version
    and the risks it scores all come back as they were."""
    version = _store_model(db)
    assert push(_xid_batch("node-a", 79)).status_code == 200
    pending = make_batch("node-b", gpus=2, ticks=2)
    for sample in pending["samples"]:
        sample["remapped_rows_pending"] = True
    assert push(pending).status_code == 200
    assert push(make_batch("node-c", gpus=2, ticks=2)).status_code == 200
    assessor = _assessor(db, settings)
    whole = assessor.run_once()
    snapshot = assessor.run_nodes({"node-a"}, now=whole.at + timedelta(seconds=3))
    rules = {v.rule for g in snapshot.gpus for v in g.verdicts}
    assert {"xid79_off_bus", "row_remap_pending"} <= rules, rules

    with db.read() as conn:
        back = decode_snapshot(encode_snapshot(snapshot), lambda v: assessor.bundle_of(conn, v))

    assert _view(back) == _view(snapshot)
    assert (back.at, back.fleet_at, dict(back.nodes_at)) == (
        snapshot.at, snapshot.fleet_at, dict(snapshot.nodes_at)
    )  # fmt: skip
    assert back.judged_at("node-a") == whole.at + timedelta(seconds=3)
    assert back.model_version == version and back.bundle is not None
    assert _risks(back) == _risks(snapshot)
    assert {basis for _, _, basis in _risks(back)} == {"rule", "model"}


def test_codec_keeps_absent_covariates_absent() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    features = [{"sbe_per_day": 1.5, "temp_p95_c": math.nan}, {}, {"temp_p95_c": 71.0}]
    gpus = [
        GpuAssessment(f"GPU-{i}", "node-a", i, None, None, at, 2.0, f, ())
        for i, f in enumerate(features)
    ]
    back = decode_snapshot(encode_snapshot(FleetAssessment(at, gpus, None, None)), lambda v: None)
    first, empty, third = (g.features for g in back.gpus)
    assert first["sbe_per_day"] == 1.5 and math.isnan(first["temp_p95_c"])
    assert empty == {} and third == {"temp_p95_c": 71.0}
    assert back.model_version is None and back.bundle is None


def test_codec_refuses_a_damaged_body_and_another_format() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    body = encode_snapshot(FleetAssessment(at, [], None, None))
    with pytest.raises(SnapshotFormatError, match="unreadable"):
        decode_snapshot(body[:-5], lambda v: None)
    raw = msgspec.msgpack.decode(zlib.decompress(body))
    raw["format"] = 2
    with pytest.raises(SnapshotFormatError, match="format 2"):
        decode_snapshot(zlib.compress(msgspec.msgpack.encode(raw)), lambda v: None)


def test_codec_repairs_one_nodes_unencodable_evidence_instead_of_failing_the_snapshot() -> None:
    """Issue 35: three EDAC counts of 2**63 - 1 once summed past 2**64 in a verdict's evidence
    and msgpack raised OverflowError on every whole-fleet snapshot. That verdict is now kept
    with its integers clamped to 64 bits and marked; every other GPU and verdict is as it was."""
    at = datetime(2026, 12, 1, tzinfo=UTC)
    huge = 3 * (2**63 - 1)

    def verdict(rule: str, evidence: dict[str, Any]) -> Verdict:
        return Verdict("host", rule, "warning", "investigate", False, "test", at, at,
                       evidence={"scope": "node", **evidence})  # fmt: skip

    bad = verdict("edac_ce_repeat", {"errors": huge, "labels": ["DIMM_A1"], "deep": [{"n": -huge}]})
    good = verdict("mce_deferred", {"banks": [5]})
    gpus = [
        GpuAssessment("GPU-b0", "node-bad", 0, None, None, at, 1.0, {}, (bad, good)),
        GpuAssessment("GPU-b1", "node-bad", 1, None, None, at, 1.0, {}, (bad,)),
        GpuAssessment("GPU-g0", "node-good", 0, None, None, at, 1.0, {"x": 2.0}, (good,)),
    ]
    snapshot = FleetAssessment(at, gpus, None, None)

    back = decode_snapshot(encode_snapshot(snapshot), lambda v: None)

    assert [(g.uuid, [v.rule for v in g.verdicts]) for g in back.gpus] == [
        ("GPU-b0", ["edac_ce_repeat", "mce_deferred"]),
        ("GPU-b1", ["edac_ce_repeat"]),
        ("GPU-g0", ["mce_deferred"]),
    ]
    fixed = back.gpus[0].verdicts[0].evidence
    assert fixed["errors"] == 2**63 - 1 and fixed["deep"] == [{"n": -(2**63)}]
    assert fixed["labels"] == ["DIMM_A1"]
    assert fixed["unencodable"].startswith("OverflowError")
    assert _view(FleetAssessment(at, back.gpus[2:], None, None)) == _view(
        FleetAssessment(at, gpus[2:], None, None)
    )
    assert back.gpus[0].verdicts[1].evidence == good.evidence
    repaired: list[str] = []
    assert encode_snapshot(snapshot, repaired)
    assert repaired == ["node node-bad verdict edac_ce_repeat: evidence clamped (OverflowError: "
                        "can't serialize ints < -2**63 or > 2**64 - 1)"]  # fmt: skip
    # A snapshot that encodes as it is repairs nothing.
    clean: list[str] = []
    encode_snapshot(FleetAssessment(at, gpus[2:], None, None), clean)
    assert clean == []
