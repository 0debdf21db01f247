"""Landmark covariates: right values on a hand-made inventory; nothing after the landmark leaks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tests.unit.models.tiny_inventory import make_records, tiny_inventory

from fleetwatch.models.cohort_hazard import cohort_hazard
from fleetwatch.models.features import survival_frame
from fleetwatch.models.landmark_features import (
    FEATURE_GROUPS,
    feature_columns,
    landmark_features,
)
from fleetwatch.models.landmarks import landmark_dates, landmark_training_frame
from fleetwatch.models.lot_hazard import lot_hazard
from fleetwatch.models.maintenance import maintenance_activity
from fleetwatch.models.neighbour_failures import neighbour_failures
from fleetwatch.models.slot_history import slot_history
from fleetwatch.models.snapshot import snapshot

CUT = pd.Timestamp("2016-01-01")
DAY = pd.Timedelta(days=1)


def _days(a: str, b: str | pd.Timestamp = CUT) -> float:
    return float((pd.Timestamp(b) - pd.Timestamp(a)) / DAY)


def test_snapshot_scores_the_units_survival_frame_calls_in_service() -> None:
    records = tiny_inventory()
    for at in ("2014-06-01", "2015-02-01", "2015-07-01", CUT):
        snap = snapshot(records, at)
        frame = survival_frame(records, at)
        assert set(snap.units.index) == set(frame.index[frame["in_service"]]), at
    snap = snapshot(records, CUT)
    assert sorted(snap.units.index) == [
        "0323712000002", "0323712000004", "0323816000005", "0323816000006",
    ]  # fmt: skip
    # unit 3 failed in June: its later stint is not its history, and it is not in service
    assert set(snap.stints.loc[snap.stints["serial"] == "0323712000003", "inserted"]) == {
        pd.Timestamp("2014-01-01")
    }
    assert snap.failures["time"].to_dict() == {
        "0323712000001": pd.Timestamp("2015-01-01"),
        "0323712000003": pd.Timestamp("2015-06-01"),
    }


def test_unit_and_exposure_covariates() -> None:
    f = landmark_features(tiny_inventory(), CUT, ("position", "age", "unit", "exposure"))
    five = f.loc["0323816000005"]
    assert five["n_stints"] == 2 and five["mfg_year"] == 16
    assert five["cage"] == 1 and five["node"] == 1 and five["col_odd"] == 0
    assert five["age_days"] == _days("2014-01-01")
    assert five["stint_days"] == _days("2015-04-01")
    assert five["days_cage2"] == _days("2014-01-01", "2015-03-01")  # before it was pulled
    assert five["days_cage1"] == _days("2015-04-01")
    assert five["days_cage0"] == 0.0
    assert five["days_out"] == pytest.approx(_days("2015-03-01", "2015-04-01"))
    assert f.loc["0323712000004", "days_out"] == 0.0


def test_slot_history_sees_the_predecessor() -> None:
    h = slot_history(snapshot(tiny_inventory(), CUT))
    two = h.loc["0323712000002"]  # replaced unit 1, which failed after a year
    assert two.tolist() == [1.0, 1.0, 1.0, _days("2014-01-01", "2015-01-01")]
    assert h.loc["0323712000004"].tolist() == [0.0, 0.0, -1.0, -1.0]
    # unit 5 sat in c2-0c2s3n1 before; its current slot had no one else
    assert h.loc["0323816000005", "slot_prev_n"] == 0.0


def test_neighbour_failures_are_recency_weighted_by_area() -> None:
    nb = neighbour_failures(snapshot(tiny_inventory(), CUT), half_lives=(30.0, 180.0))
    w1 = 2.0 ** (-_days("2015-01-01") / 180.0)  # unit 1 failed at c1-0c2s3n1
    w3 = 2.0 ** (-_days("2015-06-01") / 180.0)  # unit 3 failed at c1-0c2s3n0
    two = nb.loc["0323712000002"]
    assert two["nb_node_180d"] == pytest.approx(w1)
    assert two["nb_blade_180d"] == pytest.approx(w1 + w3)
    assert two["nb_node_30d"] == pytest.approx(2.0 ** (-_days("2015-01-01") / 30.0))
    assert nb.loc["0323712000004", "nb_blade_180d"] == 0.0
    assert nb.loc["0323712000004", "nb_cabinet_180d"] == pytest.approx(w1 + w3)
    assert nb.loc["0323816000006"].sum() == 0.0  # cabinet and column c2: no failure


def test_lot_hazard_recent_and_all_time() -> None:
    snap = snapshot(tiny_inventory(), CUT)
    lot = lot_hazard(snap, prefixes=(7,), half_lives=(90.0,), prior_units=1.0)
    w = 2.0 ** (-_days("2015-01-01") / 90.0) + 2.0 ** (-_days("2015-06-01") / 90.0)
    # lot 0323712: units 2 and 4 in service; the fleet prior is w over 4 units in service
    assert lot.loc["0323712000004", "lot7_recent_90d"] == pytest.approx((w + w / 4) / (2 + 1))
    assert lot.loc["0323816000006", "lot7_recent_90d"] == pytest.approx((0 + w / 4) / (2 + 1))
    # all time: lot 0323712 has 4 units seen, 2 failed; 6 units seen, 2 failed in the fleet
    assert lot.loc["0323712000002", "lot7_share"] == pytest.approx((2 + 2 / 6) / (4 + 1))


def test_maintenance_counts_healthy_removals_and_blade_visits() -> None:
    m = maintenance_activity(snapshot(tiny_inventory(), CUT), half_lives=(30.0,))
    w = 2.0 ** (-_days("2015-03-01") / 30.0)  # unit 5 pulled healthy from c2-0c2s3n1
    assert m.loc["0323816000006", "rm_cabinet_30d"] == pytest.approx(w / 2)  # 5 and 6 there
    assert m.loc["0323712000002", "rm_position_class_30d"] == pytest.approx(w / 1)  # cage 2 node 1
    assert m.loc["0323712000004", "rm_cabinet_30d"] == 0.0  # failures are not healthy removals
    # unit 6's blade was last visited when unit 5 arrived; unit 5's own arrival does not count
    assert m.loc["0323816000006", "touch_blade_days"] == _days("2015-04-01")
    assert m.loc["0323816000005", "touch_blade_days"] == _days("2014-01-01")
    assert m.loc["0323712000004", "touch_blade_days"] == 3650.0  # nobody else ever came


def test_cohort_hazard_follows_vintage_and_position() -> None:
    c = cohort_hazard(snapshot(tiny_inventory(), CUT), half_lives=(90.0,), prior_units=1.0)
    w1 = 2.0 ** (-_days("2015-01-01") / 90.0)
    w3 = 2.0 ** (-_days("2015-06-01") / 90.0)
    base = (w1 + w3) / 4
    # unit 2 is cohort 12/cage 2/node 1, where unit 1 failed; alone in it
    assert c.loc["0323712000002", "cohort_recent_90d"] == pytest.approx((w1 + base) / 2)
    assert c.loc["0323712000004", "cohort_recent_90d"] == pytest.approx(base / 2)


def test_landmark_features_ignore_everything_after_the_landmark() -> None:
    records = tiny_inventory()
    before = landmark_features(records, CUT)
    assert list(before.columns) == list(feature_columns(tuple(FEATURE_GROUPS)))
    assert np.isfinite(before.to_numpy()).all()
    later = make_records(
        [
            # failures, removals, insertions and event notes after the landmark
            ("0323712000002", "c1-0c2s3n1", "2015-01-10", "2016-02-01", "DBE"),
            ("0323712000004", "c1-0c0s0n0", "2014-01-01", "2016-03-01", None),
            ("0323712000004", "c1-0c2s3n1", "2016-03-05", "2016-09-01", "OTB"),
            ("0323712000009", "c1-0c2s3n0", "2016-02-01", "2016-05-01", "DBE"),
            ("0323816000006", "c2-0c1s1n0", None, "2016-04-01", "DBE"),
        ]
    )
    changed = records[~records["serial"].isin(["0323712000002", "0323712000004"])]
    changed = pd.concat([changed, later], ignore_index=True)
    pd.testing.assert_frame_equal(before, landmark_features(changed, CUT).loc[before.index])
    assert set(landmark_features(changed, CUT).index) == set(before.index)


def test_landmark_training_frame_labels_from_what_the_cutoff_knew() -> None:
    records = tiny_inventory()
    X, y = landmark_training_frame(records, CUT, start="2014-04-01", freq="QS")
    assert landmark_dates("2014-04-01", CUT, "QS")[0] == pd.Timestamp("2014-04-01")
    assert len(X) == len(y) and list(y.columns) == ["duration", "event", "follow_up", "landmark"]
    at = y["landmark"] == pd.Timestamp("2014-10-01")
    assert int(at.sum()) == 5  # units 1, 3, 4, 5, 6 in service then
    fails = y[at & y["event"]]
    assert sorted(fails["duration"]) == [
        _days("2014-10-01", "2015-01-01"),
        _days("2014-10-01", "2015-06-01"),
    ]
    assert (y.loc[at, "follow_up"] == _days("2014-10-01")).all()
    quiet = y[at & ~y["event"]]
    assert (quiet["duration"] == quiet["follow_up"]).all()
    assert X["age_days"].gt(0).all()
    # a failure after the cutoff is unknown at it: every later landmark's units survive
    later_fail = pd.concat(
        [records, make_records([("0323816000006", "c2-0c1s1n0", None, "2016-02-01", "DBE")])],
        ignore_index=True,
    )
    X2, y2 = landmark_training_frame(later_fail, CUT, start="2014-04-01", freq="QS")
    pd.testing.assert_frame_equal(X, X2)
    pd.testing.assert_frame_equal(y, y2)


def test_landmark_training_frame_needs_follow_up() -> None:
    with pytest.raises(ValueError, match="follow-up"):
        landmark_training_frame(tiny_inventory(), CUT, min_horizon_days=5000)


def test_unknown_feature_group_is_named() -> None:
    with pytest.raises(ValueError, match="unknown feature group"):
        feature_columns(("position", "weather"))
