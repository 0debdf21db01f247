"""Decode + validate cost per GPU row: the pydantic models (before) against the hot path (after).

Eight simulated nodes x 8 GPUs, 1 or 6 ticks per batch (8 or 48 GPU rows; all 34 canonical
fields, counters growing, as benchmarks/ingest.py builds them), with no events or with two Xid
events carrying ``details``, judged with the server's limits. Per configuration, in one thread,
CPU time (``time.thread_time``, so the other processes of a shared machine count less), median of
``--rounds`` rounds of 20 passes over the batches:

- **before**: ``Batch.model_validate_json`` (what the server ran until issue 12; its duplicate
  check on the models, about 0.3 us a row, is left out, which flatters it);
- **after**: ``decode_batch``, what the server runs now (msgspec, the checks the structs cannot
  make, timestamps, the duplicate check); every body here takes its fast path (asserted);
- msgspec's bare decode into the structs, with none of the checks: the floor of this approach.

Run: ``.venv/bin/python benchmarks/validation.py [--rounds 7] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import encode, machine, make_fleet  # noqa: E402  (the same batches as the ingest benchmark)

from fleetwatch.server.ingest.batch_decoder import decode_batch, decode_fast  # noqa: E402
from fleetwatch.server.ingest.batch_structs import BatchStruct  # noqa: E402
from fleetwatch.telemetry import Batch, IngestLimits  # noqa: E402


def _bodies(nodes: int, ticks: int, events: int) -> list[bytes]:
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
        batch["events"] = [xid] * events
        bodies.append(encode(batch, False))
    return bodies


def _per_row_us(run: Callable[[bytes], Any], bodies: list[bytes], rows: int, rounds: int) -> float:
    per_row = []
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(20):
            for body in bodies:
                run(body)
        per_row.append((time.thread_time() - started) / (20 * rows) * 1e6)
    return statistics.median(per_row)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 1
    limits = IngestLimits(now=datetime.now(UTC) + timedelta(days=1))
    bare = msgspec.json.Decoder(BatchStruct)
    paths: dict[str, Callable[[bytes], Any]] = {
        "before: Batch.model_validate_json": lambda b: Batch.model_validate_json(
            b, context={"limits": limits}
        ),
        "after: decode_batch": lambda b: decode_batch(b, limits),
        "msgspec decode alone (no checks)": bare.decode,
    }
    results = []
    for ticks in (1, 6):
        for events in (0, 2):
            bodies = _bodies(nodes=8, ticks=ticks, events=events)
            assert all(decode_fast(b, limits) is not None for b in bodies), "slow path taken"
            rows = sum(len(json.loads(body)["samples"]) for body in bodies)
            figures = {
                name: _per_row_us(run, bodies, rows, args.rounds) for name, run in paths.items()
            }
            results.append({"rows_per_batch": 8 * ticks, "events_per_batch": events, **figures})
    names = list(paths)
    m = machine()
    print(
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, {m['date']}, "
        f"load average at start {m['loadavg_at_start']}; CPU us per GPU row, median of "
        f"{args.rounds} rounds\n"
    )
    print("| rows/batch | events/batch | " + " | ".join(names) + " | before / after |")
    print("|" + "---|" * (len(names) + 3))
    for r in results:
        cells = " | ".join(f"{r[n]:.2f}" for n in names)
        ratio = r[names[0]] / r[names[1]]
        print(f"| {r['rows_per_batch']} | {r['events_per_batch']} | {cells} | {ratio:.1f}x |")
    if args.json:
        args.json.write_text(json.dumps({"machine": m, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
