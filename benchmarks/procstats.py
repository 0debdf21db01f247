"""CPU and memory of processes, read from /proc (Linux): what the benchmarks charge to whom.

Shared by ``benchmarks/ingest.py`` and ``benchmarks/fleet_scale.py``. Every reader returns 0 (or
leaves the process out) when the process is gone, so a snapshot never fails mid-run.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "machine",
    "machine_busy",
    "machine_times",
    "postgres_cpu_s",
    "proc_cpu_s",
    "process_tree",
    "rss_peak_bytes",
]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[bytes]:
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def proc_cpu_s(pid: int, children: bool = False) -> float:
    """utime + stime of a process (or of its exited, reaped children) in seconds."""
    try:
        fields = _stat_fields(pid)
        first = 13 if children else 11
        return (int(fields[first]) + int(fields[first + 1])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def process_tree(root: int) -> list[int]:
    """The process and its direct children (uvicorn workers when there are several)."""
    pids = [root]
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if int(_stat_fields(int(entry.name))[1]) == root:
                        pids.append(int(entry.name))
                except (OSError, IndexError, ValueError):
                    continue
    except OSError:
        pass
    return pids


def rss_peak_bytes(pid: int) -> int:
    """The process's peak resident set size (VmHWM); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def postgres_cpu_s(database: str | None) -> dict[int, float]:
    """CPU seconds per PostgreSQL process that works for ``database``: its backends plus the
    shared background processes (WAL writer, checkpointer, ...); other databases' backends (the
    machine is shared) are left out. Compare sums of two snapshots, not per-pid values: a backend
    that exited meanwhile has its CPU in the postmaster's reaped-children time (key -1 - pid)."""
    out: dict[int, float] = {}
    if database is None:
        return out
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm", "rb") as f:
                if f.read().strip() != b"postgres":
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if database in cmdline or "(" not in cmdline:
            out[int(entry.name)] = proc_cpu_s(int(entry.name))
            if "(" not in cmdline and " -D " in cmdline:
                # The postmaster: on a shared machine this includes others' exited sessions.
                out[-1 - int(entry.name)] = proc_cpu_s(int(entry.name), children=True)
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies from /proc/stat, all CPUs."""
    busy, _, total = machine_times()
    return busy, total


def machine_times() -> tuple[float, float, float]:
    """(busy, waiting for I/O, total) jiffies from /proc/stat, all CPUs."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0, 0.0
    iowait = parts[4] if len(parts) > 4 else 0
    return float(sum(parts) - parts[3] - iowait), float(iowait), float(sum(parts))


def machine() -> dict[str, Any]:
    """What a benchmark ran on, for its report."""
    model = "?"
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
