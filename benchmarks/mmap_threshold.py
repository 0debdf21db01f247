"""What a fixed glibc mmap threshold costs (``malloc_mmap_threshold_kb``, server/malloc_mmap.py).

Each round makes the temporaries of a judge's pass over 100,000 GPUs' windows (a 30 MB float64
column times two, a 15 MB half of it) and drops them, in a fresh interpreter: once with glibc's
own sliding threshold (after the first round, every such array comes from the heap, its pages
reused) and once with the server's fixed one (each array a mapping of its own: a system call
and fresh pages every time). Prints the CPU seconds of each, side by side, ``--repeat`` times.

Run: ``.venv/bin/python benchmarks/mmap_threshold.py [--rounds 200] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

_PROGRAM = """
import sys, time
import numpy as np
from fleetwatch.server.malloc_mmap import fix_mmap_threshold
if sys.argv[2] != "0":
    assert fix_mmap_threshold(int(sys.argv[2]))
column = np.random.default_rng(1).random(3_700_000)
started = time.process_time()
for _ in range(int(sys.argv[1])):
    doubled = column * 2.0
    half = doubled[::2].copy()
    del doubled, half
print(time.process_time() - started)
"""


def cpu_s(rounds: int, threshold: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(rounds), str(threshold)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threshold-kb", type=int, default=256)
    args = parser.parse_args()
    print(f"{args.rounds} rounds of 45 MB of temporaries; CPU seconds")
    print(f"| try | glibc's sliding threshold | fixed at {args.threshold_kb} KiB |")
    print("|---:|---:|---:|")
    for i in range(args.repeat):
        sliding = cpu_s(args.rounds, 0)
        fixed = cpu_s(args.rounds, args.threshold_kb * 1024)
        print(f"| {i + 1} | {sliding:.2f} | {fixed:.2f} |", flush=True)


if __name__ == "__main__":
    main()
