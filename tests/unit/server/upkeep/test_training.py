"""The risk models' training frame, from stored lifetimes and hourly rollups, on both databases."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from fleetwatch.inventory import TITAN_LOCATION_PATTERN
from fleetwatch.models.telemetry_features import FEATURE_NAMES, HourRollup
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly, gpu_lifetimes
from fleetwatch.server.upkeep.training_frame import (
    CHUNK_GPUS,
    SPAN_WINDOWS,
    read_chunks,
    training_frame,
    window_outcomes,
)

NOW = datetime(2025, 6, 1, tzinfo=UTC)


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _lifetime(serial: str, installed: str, **extra: Any) -> dict[str, Any]:
    row = {
        "serial": serial,
        "gpu_uuid": None,
        "location": None,
        "sku": None,
        "installed_at": _t(installed),
        "removed_at": None,
        "end_kind": None,
        "source": "observed",
    }
    row.update(extra)
    return row


def _hour(uuid: str, hour: str, **extra: Any) -> dict[str, Any]:
    rollup = HourRollup(gpu_uuid=uuid, hour=_t(hour), samples=60, span_s=3600.0, **extra)
    return {**rollup.as_row(), "node_id": 1}


def _store(db: Database) -> None:
    lifetimes = [
        _lifetime("S1", "2025-01-01", gpu_uuid="GPU-1", sku="H100", location="c1-2c0s3n1",
                  removed_at=_t("2025-05-01"), end_kind="failure"),
        _lifetime("S2", "2025-03-01", gpu_uuid="GPU-2", removed_at=_t("2025-04-01"),
                  end_kind="repair"),
        _lifetime("S3", "2025-05-02", gpu_uuid="GPU-3", sku="A100", location="not-a-titan-slot"),
        _lifetime("S4", "2025-07-01", sku="H100"),  # installed after `now`: not known yet
        _lifetime("S5", "2024-06-01", sku="H100", removed_at=_t("2025-02-01"),
                  end_kind="retirement"),
    ]  # fmt: skip
    hours = [
        # GPU-1, the week before its failure on 2025-05-01:
        _hour("GPU-1", "2025-04-30 10:00", sbe_errors=10.0, temp_p95_c=70.0),
        _hour("GPU-1", "2025-04-30 11:00", sbe_errors=10.0, temp_p95_c=80.0),
        _hour("GPU-1", "2025-04-01 10:00", sbe_errors=500.0, temp_p95_c=99.0),  # too early
        _hour("GPU-1", "2025-05-01 00:00", temp_p95_c=99.0),  # at the end: after the failure
        # GPU-3, in service: the week before `now`.
        _hour("GPU-3", "2025-05-31 12:00", remapped_rows=4, throttle_reported=10, throttled=5),
    ]
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), lifetimes)
        conn.execute(insert(gpu_hourly), hours)


def test_training_frame_durations_events_and_groups(db: Database) -> None:
    _store(db)
    with db.read() as conn:
        frame = training_frame(conn, now=NOW)
    assert len(frame) == 4  # S4 was installed after `now`
    rows = frame.reset_index(drop=True)
    assert rows["duration_days"].tolist() == pytest.approx([120.0, 31.0, 30.0, 245.0])
    assert rows["event"].tolist() == [1, 0, 0, 0]  # repairs, retirements and open: censored
    assert rows["group"].tolist() == ["H100", None, "A100", "H100"]
    assert set(FEATURE_NAMES) <= set(frame.columns)
    assert not any(c.startswith("loc_") for c in frame.columns)


def test_training_frame_telemetry_covers_the_window_before_the_end(db: Database) -> None:
    _store(db)
    with db.read() as conn:
        frame = training_frame(conn, now=NOW, window_days=7).reset_index(drop=True)
    failed, repaired, open_, no_uuid = (frame.iloc[i] for i in range(4))
    assert failed["sbe_per_day"] == pytest.approx(20.0 / 7200.0 * 86400.0)
    assert failed["temp_p95_c"] == 80.0  # the 99 degC hours lie outside the window
    assert failed["xid_hardware"] == 0.0  # reported telemetry, no Xids: a true zero
    assert math.isnan(failed["remapped_rows"])  # never reported: absent, not 0
    assert all(math.isnan(repaired[name]) for name in FEATURE_NAMES)  # no rollups at all
    assert open_["remapped_rows"] == 4.0 and open_["throttle_fraction"] == 0.5
    assert all(math.isnan(no_uuid[name]) for name in FEATURE_NAMES)

    with db.read() as conn:
        wide = training_frame(conn, now=NOW, window_days=40).reset_index(drop=True)
    assert wide.loc[0, "temp_p95_c"] == 99.0  # a wider window reaches the early hot hour


def test_training_frame_parses_locations_into_covariates(db: Database) -> None:
    _store(db)
    with db.read() as conn:
        frame = training_frame(conn, now=NOW, location_pattern=TITAN_LOCATION_PATTERN)
    rows = frame.reset_index(drop=True)
    loc = [c for c in frame.columns if c.startswith("loc_")]
    assert sorted(loc) == ["loc_cage", "loc_col", "loc_node", "loc_row", "loc_slot"]
    assert rows.loc[0, loc].to_dict() == {
        "loc_col": 1.0,
        "loc_row": 2.0,
        "loc_cage": 0.0,
        "loc_slot": 3.0,
        "loc_node": 1.0,
    }
    assert rows.loc[1:, loc].isna().all().all()  # no location, or one the pattern does not fit


def test_training_frame_of_an_empty_database_is_empty(db: Database) -> None:
    with db.read() as conn:
        frame = training_frame(conn, now=NOW)
    assert len(frame) == 0 and "duration_days" in frame.columns


def test_training_frame_reads_many_gpus_in_bulk(db: Database) -> None:
    n = 1200  # more than one chunk of GPUs
    end = NOW - timedelta(days=1)
    with db.write() as conn:
        conn.execute(
            insert(gpu_lifetimes),
            [_lifetime(f"B{i}", "2025-01-01", gpu_uuid=f"GPU-B{i}", removed_at=end,
                       end_kind="failure") for i in range(n)],
        )  # fmt: skip
        conn.execute(
            insert(gpu_hourly),
            [_hour(f"GPU-B{i}", "2025-05-30 00:00", temp_p95_c=float(i % 90)) for i in range(n)],
        )
    with db.read() as conn:
        frame = training_frame(conn, now=NOW)
    assert len(frame) == n and frame["event"].sum() == n
    assert frame["temp_p95_c"].tolist() == [float(i % 90) for i in range(n)]


def test_training_frame_at_a_past_now_knows_nothing_after_it(db: Database) -> None:
    """The frame at a past ``now`` is what a refit then saw: a later removal is not yet one, and
    the hour that straddles ``now`` (its row holds samples from after it) is left out."""
    cutoff = _t("2025-05-20 10:30")
    with db.write() as conn:
        conn.execute(
            insert(gpu_lifetimes),
            [_lifetime("P1", "2025-05-01", gpu_uuid="GPU-P1", removed_at=_t("2025-05-25"),
                       end_kind="failure")],
        )  # fmt: skip
        conn.execute(
            insert(gpu_hourly),
            [
                _hour("GPU-P1", "2025-05-20 09:00", temp_p95_c=70.0),  # ended 10:00: known
                _hour("GPU-P1", "2025-05-20 10:00", temp_p95_c=95.0),  # runs to 11:00: not yet
            ],
        )
    with db.read() as conn:
        past = training_frame(conn, now=cutoff).reset_index(drop=True)
        later = training_frame(conn, now=_t("2025-05-20 11:00")).reset_index(drop=True)
    assert past["event"].tolist() == [0]  # the failure came after the cutoff
    assert past["duration_days"].tolist() == pytest.approx([19.4375])
    assert past["temp_p95_c"].tolist() == [70.0]
    assert later["temp_p95_c"].tolist() == [95.0]  # both hours, p95 the hotter's


def test_window_outcomes_label_the_units_in_service_at_its_start(db: Database) -> None:
    _store(db)
    with db.write() as conn:
        conn.execute(
            insert(gpu_lifetimes),
            [
                _lifetime("W1", "2025-01-01", removed_at=_t("2025-05-20"), end_kind="failure"),
                _lifetime("W2", "2025-01-01", removed_at=_t("2025-05-21"), end_kind="repair"),
                _lifetime("W3", "2025-01-01", removed_at=_t("2025-06-03"), end_kind="failure"),
            ],
        )
    start, end = _t("2025-05-10"), NOW
    with db.read() as conn:
        outcomes = window_outcomes(conn, start=start, end=end)
        past = training_frame(conn, now=start)
        serials = dict(conn.execute(select(gpu_lifetimes.c.id, gpu_lifetimes.c.serial)).all())
    # S1, S2 and S5 ended before the start, S4 was installed after it.
    assert {serials[i]: bool(v) for i, v in outcomes.items()} == {
        "S3": False,  # still in service
        "W1": True,  # failed inside the window
        "W2": False,  # repaired: not a failure
        "W3": False,  # failed after the window's end
    }
    # Every unit is an open row of the frame at the start, its duration its age then.
    assert (past.loc[outcomes.index, "event"] == 0).all()
    ages = past.loc[outcomes.index, "duration_days"].tolist()
    assert ages == pytest.approx([8.0, 129.0, 129.0, 129.0])
    with pytest.raises(ValueError, match="must end after"):
        window_outcomes(conn, start=end, end=start)


def test_rollups_are_read_in_chunks_of_gpus_whose_windows_lie_close_together() -> None:
    """Lifetimes that ended months apart are not read in one query spanning the months
    between them (at 2,000 GPUs that read the whole table: 107 s for a week per lifetime)."""
    week = timedelta(days=7)
    windows = {f"GPU-{i}": [(NOW - week, NOW)] for i in range(1200)}  # in service
    ends = [NOW - timedelta(days=d) for d in (100, 99, 60, 20)]  # ended at different times
    windows.update({f"OLD-{i}": [(end - week, end)] for i, end in enumerate(ends)})
    chunks = list(read_chunks(windows))
    seen = [u for chunk, _, _ in chunks for u in chunk]
    assert sorted(seen) == sorted(windows)  # every GPU once
    assert all(len(chunk) <= CHUNK_GPUS for chunk, _, _ in chunks)
    for chunk, start, end in chunks:
        assert end - start <= SPAN_WINDOWS * week
        for u in chunk:  # each chunk's span covers its GPUs' windows
            assert all(start <= lo and hi <= end for lo, hi in windows[u])
    old = [{u for u in chunk if u.startswith("OLD")} for chunk, _, _ in chunks]
    assert {"OLD-0", "OLD-1"} in old  # a day apart: read together
    assert {"OLD-2"} in old and {"OLD-3"} in old  # weeks apart: apart
