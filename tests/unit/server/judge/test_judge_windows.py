"""The judge's columnar windows: thinned exactly as FleetJudge._thinned thins one window, and
every value handed back as it was read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from fleetwatch.rules.health import BootSample
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.judge.windows import SampleWindows
from fleetwatch.telemetry import GpuSample

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"
FIELDS = ("gpu_temp_c", "ecc_sbe_volatile_total", "remapped_rows_pending")
KINDS = (float, int, bool)
US = timedelta(microseconds=1)
SEED = 20261201


def _judge() -> FleetJudge:
    return FleetJudge(catalog=XidCatalog.load(), thresholds=HealthThresholds())


def _stamps(rng: np.random.Generator, n: int) -> list[datetime]:
    start = NOW - timedelta(seconds=float(rng.integers(0, 2000)))
    gaps = rng.choice([1.0, 5.0, 10.0, 10.0, 10.0, 30.0, 61.5, 400.0], size=n)
    return [start + timedelta(seconds=float(s)) for s in np.cumsum(gaps)]


def _add(windows: SampleWindows, slot: int, stamps: list[datetime], boot: str = "b") -> None:
    n = len(stamps)
    columns = [[60.0] * n, list(range(n)), [False] * n]
    windows.add([slot] * n, stamps, [boot] * n, columns)


def _compact(windows: SampleWindows, judge: FleetJudge) -> None:
    windows.compact(judge.history // US, judge.dense // US, judge.sparse_step // US)


def test_compacting_keeps_what_thinning_each_window_keeps() -> None:
    rng = np.random.default_rng(SEED)
    judge = _judge()
    windows = SampleWindows(FIELDS, KINDS)
    expected = {}
    for slot in range(60):
        stamps = _stamps(rng, int(rng.integers(1, 150)))
        # Added in two parts with a compaction between, as passes do.
        cut = int(rng.integers(0, len(stamps) + 1))
        _add(windows, slot, stamps[:cut])
        _compact(windows, judge)
        _add(windows, slot, stamps[cut:])
        # What the list-based judge kept: each pass trims to its history, then thins.
        window: list[BootSample] = []
        for part in (stamps[:cut], stamps[cut:]):
            window += [BootSample("b", GpuSample.model_construct(uuid=UUID, ts=t)) for t in part]
            if window:
                horizon = window[-1].sample.ts - judge.history
                window = judge._thinned([s for s in window if s.sample.ts >= horizon])
        expected[slot] = [s.sample.ts for s in window]
    _compact(windows, judge)
    for position, slot in enumerate(windows.slots.tolist()):
        got = [s.sample.ts for s in windows.series(position, UUID)]
        assert got == expected[slot], slot
    assert sorted(windows.slots.tolist()) == sorted(expected)


def test_older_and_repeated_samples_are_skipped() -> None:
    windows = SampleWindows(FIELDS, KINDS)
    t = [NOW + timedelta(seconds=10 * i) for i in range(4)]
    windows.add([0, 0], [t[1], t[2]], ["b", "b"], [[1.0, 2.0], [1, 2], [False, False]])
    windows.merge()  # one pass's read
    # t[0] is older than the newest, t[2] a repeat; t[3] twice in one call: the first stands.
    windows.add([0, 0, 0, 0], [t[0], t[2], t[3], t[3]], ["b"] * 4,
                [[9.0, 9.0, 3.0, 9.0], [9, 9, 3, 9], [True, True, False, True]])  # fmt: skip
    windows.merge()
    series = windows.series(0, UUID)
    assert [s.sample.ts for s in series] == t[1:]
    assert [s.sample.gpu_temp_c for s in series] == [1.0, 2.0, 3.0]


def test_values_come_back_as_they_were_read() -> None:
    windows = SampleWindows(FIELDS, KINDS)
    huge = 2**63 - 1  # a counter float64 cannot hold
    windows.add(
        [3, 3, 3],
        [NOW, NOW + timedelta(seconds=10), NOW + timedelta(seconds=20)],
        [None, "boot-1", "boot-1"],
        [[41.25, None, 0.0], [huge, 7, None], [True, None, False]],
    )
    windows.merge()
    series = windows.series(0, UUID)
    assert [s.boot_id for s in series] == [None, "boot-1", "boot-1"]
    got = [
        (s.sample.gpu_temp_c, s.sample.ecc_sbe_volatile_total, s.sample.remapped_rows_pending)
        for s in series
    ]
    assert got == [(41.25, huge, True), (None, 7, None), (0.0, None, False)]
    assert [type(v) for v in got[0]] == [float, int, bool]
    assert windows.has_inexact().tolist() == [True]
    assert series[0].sample.ts == NOW and series[0].sample.uuid == UUID


def test_a_rule_reading_a_field_the_windows_do_not_keep_fails_loudly() -> None:
    windows = SampleWindows(FIELDS, KINDS)
    windows.add([0], [NOW], ["b"], [[50.0], [1], [False]])
    windows.merge()
    sample = windows.series(0, UUID)[0].sample
    with pytest.raises(AttributeError):
        _ = sample.power_w


def test_columns_read_back_exactly_whether_stored_narrow_or_not() -> None:
    """A field's column is kept as float32 while that is exact; a value float32 would round
    (61.1, 2**24 + 1) turns it float64, and readers get the float64 values either way."""
    windows = SampleWindows(FIELDS, KINDS)
    t = [NOW + timedelta(seconds=10 * i) for i in range(4)]
    windows.add([0, 0], t[:2], ["b", "b"], [[60.0, 61.0], [1, 2], [False, True]])
    windows.merge()
    windows.add([1, 0], [t[0], t[2]], ["b", "b"], [[61.1, 62.0], [2**24 + 1, None], [None, False]])
    windows.merge()
    assert windows.column("gpu_temp_c").dtype == np.float64
    assert windows.column("gpu_temp_c").tolist() == [60.0, 61.0, 62.0, 61.1]
    counters = windows.column("ecc_sbe_volatile_total")
    assert counters[:2].tolist() == [1.0, 2.0] and np.isnan(counters[2])
    assert counters[3] == float(2**24 + 1)
    assert dict(windows.columns()).keys() == set(FIELDS)
    assert windows.series(1, UUID)[0].sample.ecc_sbe_volatile_total == 2**24 + 1
    assert windows.series(1, UUID)[0].sample.gpu_temp_c == 61.1


def test_merging_places_new_samples_as_a_full_sort_would() -> None:
    rng = np.random.default_rng(SEED)
    windows = SampleWindows(FIELDS, KINDS)
    seen: dict[int, list[datetime]] = {}
    for _ in range(5):  # passes, each adding to a random set of slots (some new)
        slots = rng.choice(40, size=int(rng.integers(1, 40)), replace=False).tolist()
        for slot in slots:
            newest = seen[slot][-1] if slot in seen else NOW
            stamps = [
                newest + timedelta(seconds=10 * (k + 1)) for k in range(int(rng.integers(1, 4)))
            ]
            _add(windows, slot, stamps)
            seen.setdefault(slot, []).extend(stamps)
        windows.merge()
    assert windows.slots.tolist() == sorted(seen)
    for position, slot in enumerate(windows.slots.tolist()):
        assert [s.sample.ts for s in windows.series(position, UUID)] == seen[slot]
