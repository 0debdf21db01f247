#!/usr/bin/env python3
"""Read every GPU through FleetWatch's NVML adapter and print what it saw, as JSON.

Run it on a GPU node (``python scripts/nvml_probe.py --repeat 20``) to learn, per GPU, which
canonical fields this GPU and driver offer, their values, which fields were turned off and why
(the WARNING lines on stderr), and how long one full read of all GPUs takes. ``--watch S`` also
waits S seconds for NVML events (Xid, double-bit ECC) and prints those that came.

Exit status: 0 on success, 2 where NVML is unavailable (no driver, no nvidia-ml-py).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from fleetwatch.agent.nvml import Nvml
from fleetwatch.errors import NvmlUnavailable
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES


def probe(repeat: int, watch_s: float) -> dict[str, Any]:
    with Nvml() as nvml:
        reads, durations = [], []
        for _ in range(max(1, repeat)):
            started = time.perf_counter()
            reads.append(nvml.read_all(datetime.now(UTC)))
            durations.append(time.perf_counter() - started)
        last = reads[-1]
        gpus = []
        for gpu, sample in zip(last.gpus, last.samples, strict=True):
            values = sample.values()
            gpus.append(
                {
                    "identity": gpu.model_dump(),
                    "values": values,
                    "disabled": sorted(nvml.disabled.get(gpu.uuid, ())),
                    "absent": [f for f in SAMPLE_FIELD_NAMES if f not in values],
                }
            )
        events = _watch(nvml, watch_s) if watch_s > 0 else []
        return {
            "driver_version": nvml.driver_version,
            "gpu_count": len(last.gpus) + len(last.lost),
            "gpus": gpus,
            "lost": [{"index": g.index, "uuid": g.uuid, "message": g.message} for g in last.lost],
            "fields_missing_from_nvidia_ml_py": list(nvml.unavailable_fields),
            "errors": {f"{c}/{r}": n for (c, r), n in sorted(nvml.errors.items())},
            "read_seconds": {
                "first": durations[0],
                "median": statistics.median(durations),
                "max": max(durations),
                "repeats": len(durations),
            },
            "events": events,
        }


def _watch(nvml: Nvml, seconds: float) -> list[dict[str, Any]]:
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        return [e.model_dump(mode="json") for e in nvml.watch_events(stop, timeout_ms=200)]
    finally:
        timer.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="full reads to time (default 5)")
    parser.add_argument("--watch", type=float, default=0.0, help="seconds to wait for events")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    try:
        report = probe(args.repeat, args.watch)
    except NvmlUnavailable as exc:
        sys.stdout.write(json.dumps({"error": str(exc)}) + "\n")
        return 2
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
