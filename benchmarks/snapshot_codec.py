#!/usr/bin/env python
"""What sharing the leader's assessment costs: encode and decode a whole-fleet snapshot.

The leader encodes each whole-fleet snapshot once (``server/judge/snapshot_codec.py``) and every
other process decodes it instead of judging the fleet itself. This builds a synthetic snapshot of
``--nodes`` x 8 GPUs, every GPU with every covariate (random floats: the least compressible case;
a real fleet's covariates repeat more, see benchmarks/HISTORY.md for a stored one) and one GPU in a
hundred with an Xid verdict, then times each direction ``--repeat`` times in this process's CPU,
with the server's collector threshold (``gc_gen0_threshold``, 50,000), and prints the size.

Run: ``.venv/bin/python benchmarks/snapshot_codec.py [--nodes 12500] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from fleetwatch.config import ServerSettings
from fleetwatch.models.telemetry_features import FEATURE_NAMES
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.judge.snapshot_codec import decode_snapshot, encode_snapshot


def synthetic_snapshot(nodes: int, seed: int = 1) -> FleetAssessment:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    xid = Verdict(
        "xid", "xid79_off_bus", "fatal", "drain_and_reset", True, "catalog:79", now, now,
        (79,), {"count": 1, "timestamps": [now.isoformat()]},
    )  # fmt: skip
    gpus = []
    for n in range(nodes):
        for i in range(8):
            features = {name: rng.random() for name in FEATURE_NAMES}
            gpus.append(
                GpuAssessment(
                    f"GPU-{n:08d}-{i:04d}-0000-0000-000000000000",
                    f"node-{n:05d}",
                    i,
                    f"1652823{n:05d}{i}",
                    "NVIDIA H100 80GB HBM3",
                    now - timedelta(days=300),
                    300.0,
                    features,
                    (xid,) if rng.random() < 0.01 else (),
                )
            )
    return FleetAssessment(now, gpus, None, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=12500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeat = 20, 1
    gen0 = ServerSettings(_env_file=None).gc_gen0_threshold  # type: ignore[call-arg]
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)
    print(f"building {args.nodes * 8:,} GPUs ...", file=sys.stderr, flush=True)
    snapshot = synthetic_snapshot(args.nodes)
    for attempt in range(1, args.repeat + 1):
        started = time.process_time()
        body = encode_snapshot(snapshot)
        encoded = time.process_time() - started
        started = time.process_time()
        back = decode_snapshot(body, lambda version: None)
        decoded = time.process_time() - started
        assert len(back.gpus) == len(snapshot.gpus)
        print(
            f"run {attempt}: {len(snapshot.gpus):,} GPUs, encode {encoded:.2f} CPU s, decode "
            f"{decoded:.2f} CPU s, {len(body):,} bytes ({len(body) / len(snapshot.gpus):.0f} B "
            "per GPU)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
