"""An hour folded chunk by chunk with numpy equals rollup_hour over all its samples at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from fleetwatch.models.hour_folds import FOLD_COLUMNS, HourFold, SampleChunk
from fleetwatch.models.telemetry_features import rollup_hour
from fleetwatch.rules.xid_catalog import XidCatalog

HOUR = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
CATALOG = XidCatalog.load()
SEED = 20261201
COUNTERS = [c for c in FOLD_COLUMNS if c not in ("gpu_temp_c", "clocks_event_reasons")]


def _samples(rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    """One GPU's hour: counters that grow, reset and go missing; temperatures with repeats."""
    ts = HOUR + timedelta(seconds=float(rng.integers(0, 600)))
    counters = {c: int(rng.integers(0, 50)) for c in COUNTERS}
    out = []
    for _ in range(n):
        row: dict[str, Any] = {"ts": ts}
        for c in COUNTERS:
            roll = rng.random()
            if roll < 0.1:
                row[c] = None
                continue
            if roll < 0.15:
                counters[c] = int(rng.integers(0, 5))  # a reset
            elif roll < 0.5:
                counters[c] += int(rng.integers(0, 30))
            row[c] = counters[c]
        row["gpu_temp_c"] = None if rng.random() < 0.1 else float(rng.integers(50, 60)) + 0.5
        row["clocks_event_reasons"] = (
            None if rng.random() < 0.1 else int(rng.choice([0, 1, 4, 8, 0x40, 2**62]))
        )
        out.append(row)
        ts += timedelta(seconds=float(rng.choice([1, 10, 10, 30])))
    return out


def _chunk(rows: list[tuple[int, dict[str, Any]]]) -> SampleChunk:
    slot = np.array([s for s, _ in rows], np.int64)
    ts = np.array([(r["ts"] - EPOCH) // US for _, r in rows], np.int64)
    node = slot // 8
    columns = {name: [r[name] for _, r in rows] for name in FOLD_COLUMNS}
    return SampleChunk.from_columns(slot, ts, node, columns)


def _expected(samples: list[dict[str, Any]]) -> dict[str, Any]:
    row = rollup_hour("GPU-x", HOUR, samples, (), catalog=CATALOG).as_row()
    return {k: v for k, v in row.items() if k != "gpu_uuid" and k != "hour" and "xid" not in k}


@pytest.mark.parametrize("chunks", [1, 3, 17])
def test_folding_in_chunks_equals_rolling_up_at_once(chunks: int) -> None:
    rng = np.random.default_rng(SEED + chunks)
    gpus = {slot: _samples(rng, int(rng.integers(1, 120))) for slot in range(0, 400, 3)}
    fold = HourFold(HOUR)
    # Each GPU's samples are cut at random points; chunks mix GPUs, as the database returns them.
    parts: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(chunks)]
    for slot, samples in gpus.items():
        cuts = np.sort(rng.integers(0, len(samples) + 1, size=chunks - 1))
        for i, piece in enumerate(np.split(np.arange(len(samples)), cuts)):
            parts[i] += [(slot, samples[j]) for j in piece]
    for part in parts:
        rng.shuffle(part)  # the database's order within a chunk is not the slots' order
        assert fold.fold(_chunk(part)).size == 0
    slots = np.array(sorted(gpus), np.int64)
    assert fold.slots().tolist() == slots.tolist()
    for slot, row in zip(slots.tolist(), fold.rows(slots), strict=True):
        expected = _expected(gpus[slot])
        assert {k: v for k, v in row.items() if k != "node_id"} == expected, slot
        assert row["node_id"] == slot // 8
        assert [type(row[k]) for k in expected] == [type(v) for v in expected.values()]


def test_samples_older_than_what_was_folded_are_handed_back_and_redone() -> None:
    rng = np.random.default_rng(SEED)
    samples = _samples(rng, 40)
    fold = HourFold(HOUR)
    assert fold.fold(_chunk([(5, s) for s in samples[20:]])).size == 0
    assert fold.fold(_chunk([(5, s) for s in samples[:20]] + [(6, samples[0])])).tolist() == [5]
    fold.reset(np.array([5]))
    assert fold.fold(_chunk([(5, s) for s in samples])).size == 0
    assert fold.rows(np.array([5]))[0] | {"node_id": 0} == _expected(samples) | {"node_id": 0}
    assert fold.rows(np.array([6]))[0]["samples"] == 1


def test_counters_float64_cannot_sum_exactly_are_flagged() -> None:
    fold = HourFold(HOUR)
    big = dict.fromkeys(FOLD_COLUMNS) | {"ts": HOUR, "pcie_replay_total": 2**60}
    small = dict.fromkeys(FOLD_COLUMNS) | {"ts": HOUR, "pcie_replay_total": 12}
    fold.fold(_chunk([(1, big), (2, small)]))
    assert fold.inexact(np.array([1, 2])).tolist() == [True, False]
