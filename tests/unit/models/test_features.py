"""Survival frames at a cutoff: censoring, no leakage of later failures, Titan locations."""

from __future__ import annotations

import pandas as pd
import pytest

from fleetwatch.models.features import (
    TitanLocation,
    failures_in_window,
    location_covariates,
    parse_location,
    survival_frame,
)

T = pd.Timestamp


def _records() -> pd.DataFrame:
    rows = [
        # serial, location, inserted, removed, event
        ("A", "c0-0c0s0n0", "2015-01-01", "2015-07-20", "DBE"),  # failed before the cutoff
        ("B", "c1-2c1s3n1", "2015-01-01", "2017-01-01", None),  # in service at the cutoff
        ("C", "c2-0c2s7n3", "2015-01-01", "2016-06-01", "OTB"),  # fails after the cutoff
        ("D", "c3-1c0s1n2", "2015-03-01", "2015-05-01", None),  # pulled, not failed
        ("D", "c4-1c0s1n2", "2016-08-01", "2017-01-01", None),  # ...back in another slot
        ("E", "c5-5c1s2n0", "2016-02-01", "2017-01-01", None),  # installed after the cutoff
        ("F", "c6-0c0s0n0", "2015-01-01", "2015-04-01", None),  # removed, gone for good
        ("A", "c7-0c0s0n0", "2015-09-01", "2017-01-01", None),  # A after repair: ignored
        ("G", "c8-0c0s0n0", None, "2015-03-01", "DBE"),  # event row without an insert
        ("G", "c8-0c0s0n0", "2015-01-01", "2015-03-01", "DBE"),
    ]
    frame = pd.DataFrame(rows, columns=["serial", "location", "inserted", "removed", "event"])
    frame["inserted"] = pd.to_datetime(frame["inserted"])
    frame["removed"] = pd.to_datetime(frame["removed"])
    return frame


def test_censors_at_the_cutoff_without_leaking_later_failures() -> None:
    f = survival_frame(_records(), "2016-01-01")
    assert set(f.index) == {"A", "B", "C", "D", "F", "G"}  # E is not yet installed
    assert f.loc["A", "event"] and not f.loc["A", "in_service"]
    assert f.loc["A", "duration"] == (T("2015-07-20") - T("2015-01-01")).days
    assert f.loc["A", "location"] == "c0-0c0s0n0"  # stints after the first failure are ignored
    # C fails in June 2016: at a 2016-01-01 cutoff that is unknown, so C is censored and at risk
    assert not f.loc["C", "event"] and f.loc["C", "in_service"]
    assert f.loc["C", "duration"] == f.loc["C", "age_days"] == 365.0
    # D was pulled in May 2015 and is not back yet: censored at its removal
    assert not f.loc["D", "event"] and not f.loc["D", "in_service"]
    assert f.loc["D", "duration"] == (T("2015-05-01") - T("2015-03-01")).days
    assert f.loc["F", "duration"] == 90.0 and pd.isna(f.loc["F", "age_days"])
    assert f.loc["G", "event"] and f.loc["G", "duration"] == 59.0
    assert f.loc["B", "in_service"] and f.loc["B", "age_days"] == 365.0
    assert (f.loc["B", ["col", "row", "cage", "slot", "node"]] == [1, 2, 1, 3, 1]).all()


def test_later_cutoff_sees_later_events() -> None:
    f = survival_frame(_records(), "2016-12-01")
    assert (
        f.loc["C", "event"] and f.loc["C", "duration"] == (T("2016-06-01") - T("2015-01-01")).days
    )
    assert f.loc["D", "in_service"] and f.loc["D", "location"] == "c4-1c0s1n2"
    assert f.loc["D", "age_days"] == (T("2016-12-01") - T("2015-03-01")).days
    assert f.loc["E", "in_service"]


def test_failures_in_window_is_half_open() -> None:
    w = failures_in_window(_records(), "2015-07-20", "2016-06-01")
    assert list(w.index) == ["C"]  # A failed at the window's open start; C at its closed end


def test_parse_titan_location() -> None:
    assert parse_location("c11-2c1s4n1") == TitanLocation(col=11, row=2, cage=1, slot=4, node=1)
    assert parse_location(" c24-7c2s7n3 ") == (24, 7, 2, 7, 3)
    with pytest.raises(ValueError, match="not a Titan position"):
        parse_location("node-17")
    cov = location_covariates(pd.Series(["c0-5c2s6n3", "c19-0c0s0n0"], index=["x", "y"]))
    assert cov.loc["x"].tolist() == [0, 5, 2, 6, 3]
    assert list(cov.columns) == ["col", "row", "cage", "slot", "node"]
    with pytest.raises(ValueError, match="first: 'c1-1'"):
        location_covariates(pd.Series(["c0-5c2s6n3", "c1-1"]))
