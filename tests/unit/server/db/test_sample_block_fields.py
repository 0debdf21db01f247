"""Decoding a few fields of sample blocks gives exactly what decoding all of them gives.

Readers ask :func:`decode_blocks` for the fields they read only (the judge 18 of 34), so that a
chunk's transient arrays are those fields' alone. Pure codec: no database.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from fleetwatch.server.db.sample_blocks import decode_blocks, encode_blocks
from fleetwatch.server.db.sample_columns import copy_type
from fleetwatch.telemetry import SAMPLE_FIELDS

KINDS = [copy_type(spec) for spec in SAMPLE_FIELDS]


def _value(kind: str, rng: random.Random) -> object:
    if rng.random() < 0.15:
        return None  # not reported
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int2":
        return rng.randrange(0, 16)
    if kind == "int8":
        return rng.randrange(0, 2**40)
    return round(rng.uniform(20.0, 700.0), 2)


def _blocks() -> tuple[list[int], list[int], list[bytes]]:
    """Blocks of 1, 3 and 6 ticks (decoded group by group) of 12 GPUs."""
    rng = random.Random(7)
    keys, times, rows = [], [], []
    for gpu in range(12):
        ticks = (1, 3, 6)[gpu % 3]
        for tick in range(ticks):
            keys.append(gpu)
            times.append(1_800_000_000_000_000 + gpu * 1_000 + tick * 10_000_000)
            rows.append(tuple(_value(kind, rng) for kind in KINDS))
    blocks = encode_blocks(keys, times, rows)
    return [b.ts0_us for b in blocks], [b.n for b in blocks], [b.data for b in blocks]


@pytest.mark.parametrize(
    "fields",
    [
        [0],
        [len(SAMPLE_FIELDS) - 1, 0],  # out of storage order
        [j for j, kind in enumerate(KINDS) if kind in ("float4", "bool")],  # groups skipped
        [3, 3, 5],  # a field asked twice
    ],
)
def test_a_subset_decodes_as_the_whole_does(fields: list[int]) -> None:
    ts0, ns, datas = _blocks()
    whole = decode_blocks(ts0, ns, datas)
    part = decode_blocks(ts0, ns, datas, fields)
    assert np.array_equal(part.ts_us, whole.ts_us)
    assert np.array_equal(part.block, whole.block)
    assert len(part.values) == len(part.raw) == len(part.absent) == len(fields)
    for k, j in enumerate(fields):
        assert part.raw[k].dtype == whole.raw[j].dtype
        assert np.array_equal(part.raw[k], whole.raw[j])
        assert np.array_equal(part.values[k], whole.values[j], equal_nan=True)
        assert np.array_equal(part.absent[k], whole.absent[j])
    # Something of each field was reported and something not: the comparison saw both.
    assert all(whole.absent[j].any() and not whole.absent[j].all() for j in fields)


def test_no_field_asked_decodes_times_only() -> None:
    ts0, ns, datas = _blocks()
    part = decode_blocks(ts0, ns, datas, [])
    assert part.values == [] and part.raw == [] and part.absent == []
    assert np.array_equal(part.ts_us, decode_blocks(ts0, ns, datas).ts_us)
