"""A prototype of the next storage step, for measuring only: one row per GPU per window of ticks,
its fields as compressed columns.

Not used by the product. ``benchmarks/storage_size.py --blocks 6,360`` stores the same samples
this way in a throwaway PostgreSQL table and reports bytes per GPU row, after checking that every
block decodes back to what was stored (reals at float4 precision, like ``gpu_samples``).

A block holds ``n`` ticks of one GPU. Its ``data`` is zlib over, in order: the tick times as
varint millisecond deltas from the block's start; then per field, a presence bitmap and the
present values: integer fields (counters, bitmask, smallints, flags) as zigzag varint deltas from
the previous value, real fields as float4 and double fields as float8, byte-plane transposed (the
sign and exponent bytes of slowly moving values repeat, which zlib finds). A counter that does not
move costs a byte per tick before zlib and almost nothing after.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.server.db.sample_columns import copy_type
from fleetwatch.telemetry import SAMPLE_FIELDS

__all__ = ["decode_block", "encode_block"]

_KIND = {spec.name: copy_type(spec) for spec in SAMPLE_FIELDS}


def _varint(value: int, out: bytearray) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), at


def _planes(raw: bytes, width: int) -> bytes:
    return b"".join(raw[i::width] for i in range(width))


def _unplanes(data: bytes, width: int, count: int) -> bytes:
    out = bytearray(width * count)
    for i in range(width):
        out[i::width] = data[i * count : (i + 1) * count]
    return bytes(out)


def encode_block(start: datetime, samples: Sequence[dict[str, Any]]) -> bytes:
    """``samples`` of one GPU in time order (wire field names; ``ts`` a datetime)."""
    out = bytearray()
    for s in samples:
        _varint(round((s["ts"] - start) / timedelta(milliseconds=1)), out)
    for spec in SAMPLE_FIELDS:
        values = [s.get(spec.name) for s in samples]
        bits = 0
        for i, v in enumerate(values):
            if v is not None:
                bits |= 1 << i
        out += bits.to_bytes((len(samples) + 7) // 8, "little")
        present = [v for v in values if v is not None]
        kind = _KIND[spec.name]
        if kind in ("float4", "float8"):
            code, width = ("f", 4) if kind == "float4" else ("d", 8)
            out += _planes(struct.pack(f"<{len(present)}{code}", *present), width)
        else:
            previous = 0
            for v in present:
                _varint(int(v) - previous, out)
                previous = int(v)
    return zlib.compress(bytes(out), 9)


def decode_block(start: datetime, n: int, blob: bytes) -> list[dict[str, Any]]:
    data, at = zlib.decompress(blob), 0
    samples: list[dict[str, Any]] = []
    for _ in range(n):
        offset, at = _read_varint(data, at)
        samples.append({"ts": start + timedelta(milliseconds=offset)})
    for spec in SAMPLE_FIELDS:
        size = (n + 7) // 8
        bits = int.from_bytes(data[at : at + size], "little")
        at += size
        rows = [i for i in range(n) if bits >> i & 1]
        kind = _KIND[spec.name]
        if kind in ("float4", "float8"):
            code, width = ("f", 4) if kind == "float4" else ("d", 8)
            raw = _unplanes(data[at : at + width * len(rows)], width, len(rows))
            at += width * len(rows)
            values: list[Any] = list(struct.unpack(f"<{len(rows)}{code}", raw))
        else:
            values, previous = [], 0
            for _ in rows:
                delta, at = _read_varint(data, at)
                previous += delta
                values.append(bool(previous) if kind == "bool" else previous)
        for sample in samples:
            sample[spec.name] = None
        for i, v in zip(rows, values, strict=True):
            samples[i][spec.name] = v
    return samples
