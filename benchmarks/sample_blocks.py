"""The sample block codec (``server/db/sample_blocks.py``) on simulated pushes: size, time and an
exact round trip.

The samples are ``SimNode``'s of ``benchmarks/ingest.py`` (every one of the 34 fields, realistic
values, counters that only grow): ``--nodes`` x 8
GPUs, ``--pushes`` pushes of ``--ticks`` ticks 10 s apart. Each push is encoded as the server
encodes a batch (``encode_blocks`` over its rows: one block per GPU; 48 rows and 8 blocks at 6
ticks), timed alone; then every block is decoded, ``CHUNK_BLOCKS`` at a time as
``read_samples`` does, and compared with what was sent: times to the microsecond, integers and
flags exactly, doubles exactly, reals as the decimal PostgreSQL prints for their float32.

Bytes are the ``data`` column's alone (before zlib: the layout); a stored block adds its row's
header, keys and index entries: ``benchmarks/fleet_scale.py`` measures the stored bytes per row
("disk per GPU row"), and benchmarks/HISTORY.md ("Disk per GPU row") has the layouts compared.

Run: ``.venv/bin/python benchmarks/sample_blocks.py [--nodes 35] [--pushes 120] [--ticks 6]``
(``--smoke``: 2 nodes, 4 pushes, for the test suite).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import SimNode  # noqa: E402  (the samples of the ingest benchmark)

from fleetwatch.server.db.real_values import as_printed  # noqa: E402
from fleetwatch.server.db.sample_blocks import (  # noqa: E402
    EncodedBlock,
    decode_blocks,
    encode_blocks,
)
from fleetwatch.server.db.sample_columns import copy_type  # noqa: E402
from fleetwatch.server.repo.sample_reader import CHUNK_BLOCKS, to_us  # noqa: E402
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, SAMPLE_FIELDS  # noqa: E402

GPUS_PER_NODE = 8
START = datetime(2026, 11, 30, 2, tzinfo=UTC)  # no push crosses a midnight
_KIND = [copy_type(spec) for spec in SAMPLE_FIELDS]

Push = tuple[list[int], list[int], list[tuple[Any, ...]]]  # encode_blocks' arguments


def make_pushes(nodes: int, pushes: int, ticks: int, seed: int) -> list[Push]:
    """Every push of every node, in time order, as ``encode_blocks`` takes it."""
    rng = random.Random(seed)
    fleet = [SimNode(f"node-{n:04d}", GPUS_PER_NODE, START, rng) for n in range(nodes)]
    keys = {
        g.uuid: 1 + n * GPUS_PER_NODE + g.index for n, node in enumerate(fleet) for g in node.state
    }
    out: list[Push] = []
    for _ in range(pushes):
        for node in fleet:
            samples = node.samples(ticks)
            out.append(
                (
                    [keys[s["uuid"]] for s in samples],
                    [to_us(datetime.fromisoformat(s["ts"])) for s in samples],
                    [tuple(s[name] for name in SAMPLE_FIELD_NAMES) for s in samples],
                )
            )
    return out


def check(blocks: list[EncodedBlock], pushes: list[Push]) -> tuple[int, float]:
    """Decode every block and compare with the samples sent; return (rows, decode seconds)."""
    sent: dict[tuple[int, int], tuple[Any, ...]] = {}
    for keys, times, rows in pushes:
        sent.update(zip(zip(keys, times, strict=True), rows, strict=True))
    decoded, seconds = 0, 0.0
    for first in range(0, len(blocks), CHUNK_BLOCKS):
        chunk = blocks[first : first + CHUNK_BLOCKS]
        started = time.perf_counter()
        got = decode_blocks(
            [b.ts0_us for b in chunk], [b.n for b in chunk], [b.data for b in chunk]
        )
        seconds += time.perf_counter() - started
        keys = np.asarray([b.gpu_key for b in chunk], np.int64)[got.block]
        expected = [
            sent.pop((k, t)) for k, t in zip(keys.tolist(), got.ts_us.tolist(), strict=True)
        ]
        for j, kind in enumerate(_KIND):
            values = [row[j] for row in expected]
            if kind == "float4":
                want = as_printed(np.asarray(values, np.float32))
            elif kind == "float8":
                want = np.asarray(values, np.float64)
            else:
                want = np.asarray(values, np.int64)
            assert not got.absent[j].any(), SAMPLE_FIELD_NAMES[j]
            assert np.array_equal(got.raw[j].astype(want.dtype), want), SAMPLE_FIELD_NAMES[j]
        decoded += got.size
    assert not sent, f"{len(sent)} samples not decoded"
    return decoded, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=35)
    parser.add_argument("--pushes", type=int, default=120, help="pushes per node")
    parser.add_argument("--ticks", type=int, default=6, help="ticks per push (per block)")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.pushes = 2, 4

    pushes = make_pushes(args.nodes, args.pushes, args.ticks, args.seed)
    blocks: list[EncodedBlock] = []
    took: list[float] = []
    for push in pushes:
        started = time.perf_counter()
        encoded = encode_blocks(*push)
        took.append(time.perf_counter() - started)
        blocks.extend(encoded)
    rows, decode_s = check(blocks, pushes)
    data = sum(len(b.data) for b in blocks)
    layout = sum(len(zlib.decompress(b.data)) for b in blocks)
    per_push = rows // len(pushes)
    print(f"{rows:,} rows ({args.nodes} nodes x {GPUS_PER_NODE} GPUs x {args.pushes} pushes of "
          f"{args.ticks} ticks) in {len(blocks):,} blocks; round trip exact")  # fmt: skip
    print(f"- data: {data / rows:.1f} B/row ({layout / rows:.1f} B/row before zlib)")
    print(f"- encode: {1e6 * statistics.median(took):,.0f} us per push of {per_push} rows "
          f"(median; mean {1e6 * statistics.fmean(took):,.0f}), "
          f"{1e6 * sum(took) / rows:.2f} us/row")  # fmt: skip
    print(f"- decode: {1e6 * decode_s / rows:.2f} us/row ({CHUNK_BLOCKS:,} blocks at a time)")


if __name__ == "__main__":
    main()
