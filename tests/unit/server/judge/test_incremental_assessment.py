"""An assessor that judged the fleet pass after pass, samples arriving in between, ends where a
fresh assessor's one full pass over the same data ends, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.config import ServerSettings
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge import assessor as assessor_module
from fleetwatch.server.judge.assessment import FEATURES_SINCE, FleetAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.upkeep.rollups import RollupJob

START = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=20)
MINUTES = 15
BATCH_MINUTES = 3


def _values(node: str, index: int, t: float) -> dict[str, Any]:
    """What each GPU reports ``t`` seconds into the run."""
    if (node, index) == ("node-a", 0):
        return {"ecc_sbe_volatile_total": int(t * 2)}  # a corrected-ECC burst
    if (node, index) == ("node-a", 1):
        return {"gpu_temp_c": 86.0}  # at the slowdown margin
    if node == "node-b" and index == 0:
        return {"clocks_event_reasons": 0x40}  # thermally throttled throughout
    if node == "node-c":
        # Constant readings across a reboot: the replay counter's reset reads as an increase.
        return {"nvlink_replay_errors_total": 5, "clocks_event_reasons": 0x40}
    return {}


def _push_minutes(
    push: Push, node: str, interval_s: float, first: float, last: float, boot: str = "boot-1"
) -> None:
    ticks = int((last - first) * 60 / interval_s)
    at = START + timedelta(minutes=first)
    batch = make_batch(node, gpus=2, start=at, interval_s=interval_s, boot_id=boot)
    batch["samples"] = [
        make_sample(
            gpu_uuid(node, i),
            at + timedelta(seconds=interval_s * k),
            **_values(node, i, (first * 60) + interval_s * k),
        )
        for k in range(ticks)
        for i in range(2)
    ]
    if node == "node-b" and first == 6:
        batch["events"] = [
            {"kind": "xid", "ts": (at + timedelta(seconds=5)).isoformat(), "xid": 79,
             "uuid": gpu_uuid(node, 1), "message": "NVRM: Xid 79, GPU has fallen off the bus"}
        ]  # fmt: skip
    assert push(batch).status_code == 200


def _assessor(db: Database, settings: ServerSettings) -> Assessor:
    return Assessor(db, settings, XidCatalog.load(), HealthThresholds())


def _judged(snapshot: FleetAssessment) -> dict[str, Any]:
    return {g.uuid: (g.node, g.index, g.age_days, g.features, g.verdicts) for g in snapshot.gpus}


def test_passes_in_between_end_where_one_full_pass_ends(
    push: Push, db: Database, settings: ServerSettings
) -> None:
    assessor = _assessor(db, settings)
    for first in range(0, MINUTES, BATCH_MINUTES):
        last = first + BATCH_MINUTES
        for node in ("node-a", "node-b", "node-d"):
            _push_minutes(push, node, 30.0, first, last)
        # Thinned (every 10 s); rebooted half a minute before the end.
        _push_minutes(push, "node-c", 10.0, first, min(last, MINUTES - 0.5))
        if last == MINUTES:
            _push_minutes(push, "node-c", 10.0, MINUTES - 0.5, last, boot="boot-2")
        assessor.run_once(now=START + timedelta(minutes=last))
    now = START + timedelta(minutes=MINUTES, seconds=5)
    stepwise = _judged(assessor.run_once(now=now))
    fresh = _judged(_assessor(db, settings).run_once(now=now))
    rules = {uuid: {v.rule for v in judged[4]} for uuid, judged in stepwise.items()}
    assert rules[gpu_uuid("node-a", 0)] == {"ecc_sbe_rate"}
    assert rules[gpu_uuid("node-a", 1)] == {"temperature_margin"}
    assert rules[gpu_uuid("node-b", 0)] == {"persistent_throttle"}
    assert rules[gpu_uuid("node-b", 1)] == {"xid79_off_bus"}
    assert rules[gpu_uuid("node-c", 0)] == {"nvlink_replay", "persistent_throttle"}
    assert rules[gpu_uuid("node-d", 0)] == set()
    # Nodes sampled every 30 s keep every sample: the verdicts, evidence included, are equal.
    # node-c's window is thinned, and which samples a thinned window keeps depends on when
    # the passes ran (as before the windows were columns), so its verdicts are equal by rule.
    for uuid, judged in stepwise.items():
        if judged[0] == "node-c":
            assert {v.rule for v in judged[4]} == {v.rule for v in fresh[uuid][4]}
            assert judged[:4] == fresh[uuid][:4]
        else:
            assert judged == fresh[uuid], uuid
    assert set(stepwise) == set(fresh)


def test_covariates_are_recomputed_after_each_rollup_pass_only(
    push: Push, db: Database, settings: ServerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed = []
    original = assessor_module.fleet_window_features

    def counted(conn: Any, **kwargs: Any) -> Any:
        computed.append(kwargs)
        return original(conn, **kwargs)

    monkeypatch.setattr(assessor_module, "fleet_window_features", counted)
    rollups = RollupJob(db, XidCatalog.load())
    assessor = _assessor(db, settings)
    now = START + timedelta(minutes=MINUTES)
    _push_minutes(push, "node-a", 30.0, 0, 5)
    rollups(now=now)
    first = assessor.run_once(now=now)
    assessor.run_once(now=now + timedelta(seconds=30))
    assert len(computed) == 1, "no rollup pass in between: the covariates are kept"
    _push_minutes(push, "node-d", 30.0, 5, 10)  # another GPU's rollups, after a new pass
    rollups(now=now)
    second = assessor.run_once(now=now + timedelta(seconds=60))
    assert len(computed) == 2
    with db.read() as conn:
        fresh = original(conn, window=timedelta(days=settings.model_window_days),
                         since=now + timedelta(seconds=60) - FEATURES_SINCE)  # fmt: skip
    assert {g.uuid: g.features for g in second.gpus if g.features} == fresh
    assert gpu_uuid("node-d", 0) in fresh and gpu_uuid("node-d", 0) not in {
        g.uuid for g in first.gpus if g.features
    }
