"""Wire validation cost per GPU row: ``Batch.model_validate_json`` on 48-row batches.

Eight simulated nodes x 8 GPUs x 6 ticks (all 34 canonical fields, counters growing, as
benchmarks/ingest.py builds them), each batch with two Xid events carrying ``details``, validated
with the server's limits. CPU time of this thread (``time.thread_time``), so the other processes of
a shared machine count less; the median of 7 rounds of 20 passes is printed.

To compare two versions, run it once per checkout, alternating, e.g.
``PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/validation.py --label before``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import encode, make_fleet  # noqa: E402  (the same batches as the ingest benchmark)

from fleetwatch.telemetry import Batch, IngestLimits  # noqa: E402


def _bodies(nodes: int, ticks: int) -> list[bytes]:
    bodies = []
    for node in make_fleet("node", nodes, 8, seed=1):
        batch = node.batch(ticks)
        xid = {
            "kind": "xid",
            "ts": batch["samples"][0]["ts"],
            "xid": 79,
            "message": "GPU has fallen off the bus.",
            "pid": 1234,
            "process": "python",
            "details": {"raw": "NVRM: Xid (PCI:0000:18:00): 79, pid=1234", "extra": [1, 2.5]},
        }
        batch["events"] = [xid, xid]
        bodies.append(encode(batch, False))
    return bodies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    bodies = _bodies(nodes=8, ticks=6)
    rows = sum(len(json.loads(body)["samples"]) for body in bodies)
    limits = IngestLimits(now=datetime.now(UTC) + timedelta(days=1))
    per_row_us = []
    for _ in range(args.rounds):
        started = time.thread_time()
        for _ in range(20):
            for body in bodies:
                Batch.model_validate_json(body, context={"limits": limits})
        per_row_us.append((time.thread_time() - started) / (20 * rows) * 1e6)
    print(
        f"{args.label}: {statistics.median(per_row_us):.2f} us per GPU row (median of "
        f"{args.rounds} rounds, min {min(per_row_us):.2f}; {rows} rows in {len(bodies)} batches)"
    )


if __name__ == "__main__":
    main()
