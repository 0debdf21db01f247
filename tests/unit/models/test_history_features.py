"""History covariates: right counts on a hand-made inventory, nothing after the cutoff leaks in."""

from __future__ import annotations

import pandas as pd
import pytest
from tests.unit.models.tiny_inventory import make_records, tiny_inventory

from fleetwatch.models.features import MODEL_COLUMNS, survival_frame
from fleetwatch.models.history_features import (
    HISTORY_COLUMNS,
    fold_of,
    history_covariates,
    known_before,
    serial_vintage,
)

CUT = pd.Timestamp("2016-01-01")


def _covariates(records: pd.DataFrame, cutoff: pd.Timestamp = CUT) -> pd.DataFrame:
    frame = survival_frame(records, cutoff)
    return history_covariates(records, frame, cutoff, prior_units=1.0)


def test_serial_vintage_reads_year_and_lot() -> None:
    v = serial_vintage(pd.Series(["0323712007755", "0324216100001", "junk"]))
    assert v["mfg_year"].iloc[:2].tolist() == [12.0, 16.0]
    assert pd.isna(v["mfg_year"].iloc[2])
    assert v["lot"].tolist() == ["03237120", "03242161", "junk"]


def test_history_covariates_counts_on_a_tinytiny_inventory() -> None:
    h = _covariates(tiny_inventory())
    assert list(h.columns) == list(HISTORY_COLUMNS)
    # unit 2 replaced unit 1, which failed at the same node before 2 arrived
    assert h.loc["0323712000002", "loc_prior_failures"] == 1.0
    assert h.loc["0323712000001", "loc_prior_failures"] == 0.0  # its own failure is not prior
    # stints after a unit's first failure are not its history (as in survival_frame)
    assert h.loc["0323712000003", "n_stints"] == 1.0
    assert h.loc["0323816000005", "n_stints"] == 2.0
    assert h.loc["0323712000004", "col_odd"] == 1.0 and h.loc["0323816000006", "col_odd"] == 0.0
    assert h.loc["0323816000005", "mfg_year"] == 16.0
    # 6 units, 2 failed (1 and 3): base share 1/3, one pseudo-unit. Folds by serial hash:
    # units 1, 4 and 6 in fold 3, units 2 and 3 in fold 2, unit 5 in fold 4.
    assert fold_of(h.index, 5).tolist() == [3, 2, 2, 3, 4, 3]
    # Lot 03237120 holds units 1-4; for unit 4 the lot outside fold 3 is units 2 and 3, one
    # failure -> (1 + 1/3) / (2 + 1)
    assert h.loc["0323712000004", "lot_fail_rate"] == pytest.approx((1 + 1 / 3) / 3)
    # cabinet c1-0 held units 1-4; for unit 2 (fold 2) the others outside it are 1 and 4
    assert h.loc["0323712000002", "cabinet_fail_rate"] == pytest.approx((1 + 1 / 3) / 3)
    # blade c1-0c2s3 held 1, 2, 3; for unit 2 only unit 1 (failed) is outside fold 2
    assert h.loc["0323712000002", "blade_fail_rate"] == pytest.approx((1 + 1 / 3) / 2)
    # cabinet c2-0 had no failure: unit 6 sees unit 5 alone, (0 + 1/3) / (1 + 1)
    assert h.loc["0323816000006", "cabinet_fail_rate"] == pytest.approx((1 / 3) / 2)


def test_a_units_group_rates_do_not_depend_on_its_own_outcome() -> None:
    """Units 1 (failed) and 4 (in service) share a lot, a cabinet and a fold: they get the same
    rates. Leaving out only the unit itself would give the failed one (1 + 1/3) / 4 and the
    healthy one (2 + 1/3) / 4: its own label, readable from its covariate."""
    h = _covariates(tiny_inventory())
    failed, healthy = h.loc["0323712000001"], h.loc["0323712000004"]
    assert failed["lot_fail_rate"] == healthy["lot_fail_rate"] == pytest.approx(4 / 9)
    assert failed["cabinet_fail_rate"] == healthy["cabinet_fail_rate"]
    with pytest.raises(ValueError, match="folds"):
        history_covariates(tiny_inventory(), survival_frame(tiny_inventory(), CUT), CUT, folds=1)


def test_history_covariates_ignore_everything_after_the_cutoff() -> None:
    records = tiny_inventory()
    before = _covariates(records)
    later = make_records(
        [
            # failures, removals and insertions after the cutoff, at the same places and lots
            ("0323712000002", "c1-0c2s3n1", "2015-01-10", "2016-02-01", "DBE"),
            ("0323712000004", "c1-0c0s0n0", "2014-01-01", "2016-03-01", "OTB"),
            ("0323712000009", "c1-0c2s3n0", "2016-02-01", "2016-05-01", "DBE"),
            ("0323816000007", "c2-0c1s1n1", None, "2016-04-01", "DBE"),
        ]
    )
    changed = records[~records["serial"].isin(["0323712000002", "0323712000004"])]
    changed = pd.concat([changed, later], ignore_index=True)
    after = _covariates(changed)
    pd.testing.assert_frame_equal(before, after)
    # the unit that fails after the cutoff is still scored, with the same features
    frame = survival_frame(changed, CUT, history=True)
    assert frame.loc["0323712000002", "in_service"]
    pd.testing.assert_frame_equal(
        frame[list(HISTORY_COLUMNS)],
        survival_frame(records, CUT, history=True)[list(HISTORY_COLUMNS)],
    )


def test_known_before_forgets_later_removals_and_events() -> None:
    known = known_before(tiny_inventory(), "2015-02-01")
    assert "0323712000003" in set(known["serial"])
    row = known[known["serial"] == "0323712000003"].iloc[0]
    assert pd.isna(row["removed"]) and row["event"] is None  # fails in June, unknown in Feb
    assert (known["inserted"] < pd.Timestamp("2015-02-01")).all()


def test_history_covariates_see_failures_once_they_are_known() -> None:
    h = _covariates(tiny_inventory(), pd.Timestamp("2014-12-01"))
    # before unit 1 failed nobody in lot 03237120 had failed
    assert h.loc["0323712000004", "lot_fail_rate"] == pytest.approx((0 + 0) / 4)
    assert "0323712000002" not in h.index  # not yet inserted


def test_model_columns_are_in_the_history_frame() -> None:
    frame = survival_frame(tiny_inventory(), CUT, history=True)
    assert set(MODEL_COLUMNS) <= set(frame.columns)


def test_history_covariates_reject_bad_prior() -> None:
    records = tiny_inventory()
    with pytest.raises(ValueError, match="prior_units"):
        history_covariates(records, survival_frame(records, CUT), CUT, prior_units=0.0)
