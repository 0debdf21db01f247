"""The parties of ``benchmarks/fleet_scale.py`` and what each one costs: the server processes,
the benchmark's own child processes (load generator, exporter pages), and CPU snapshots of all of
them, PostgreSQL and Prometheus included, from /proc.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from procstats import machine_times, postgres_cpu_s, proc_cpu_s, process_tree
from serverproc import ServerGroup, running_server

__all__ = ["Child", "Parties", "PostgresCpu", "Snapshot", "child", "log", "server_group"]


class _Measured(Protocol):
    def cpu_s(self) -> float: ...


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def server_group(
    database_url: str, workdir: Path, api_processes: int, settings: dict[str, str] | None = None
) -> Iterator[ServerGroup]:
    # A server with 100,000 GPUs in memory may take a while to stop: wait, then kill.
    env = {f"FLEETWATCH_SERVER_{k.upper()}": v for k, v in (settings or {}).items()}
    with contextlib.ExitStack() as stack:
        if api_processes == 0:
            server = running_server(database_url, workdir, 1, env, stop_timeout_s=60)
            yield ServerGroup.one(stack.enter_context(server))
            return
        worker = stack.enter_context(
            running_server(database_url, workdir, 1, env, "worker", stop_timeout_s=60)
        )
        apis = [
            stack.enter_context(
                running_server(database_url, workdir, 1, env, "api", stop_timeout_s=60)
            )
            for _ in range(api_processes)
        ]
        yield ServerGroup([worker, *apis], apis)


class Child:
    """A benchmark process whose stdout lines are read in a thread."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as sink:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=sink, text=True, bufsize=1
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout_s: float) -> str:
        """The next line; raises ``queue.Empty`` on timeout, SystemExit when the process ended."""
        line = self.lines.get(timeout=max(0.0, timeout_s))
        if line is None:
            self.process.wait()
            raise SystemExit(
                f"{self.process.args!r} exited {self.process.returncode}:\n"
                + self.log_path.read_text()[-4000:]
            )
        return line

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def child(command: list[str], log_path: Path) -> Iterator[Child]:
    process = Child(command, log_path)
    try:
        yield process
    finally:
        process.stop()


class PostgresCpu(threading.Thread):
    """CPU of the PostgreSQL processes that work for ``database`` since :meth:`begin`: its
    backends and autovacuum workers, and the shared background processes (WAL writer,
    checkpointer, ...), sampled every second so that a process that exits meanwhile still counts
    up to its last sample. Unlike ``procstats.postgres_cpu_s`` the postmaster's reaped-children
    time is left out: on a shared machine it is mostly other sessions' connections.

    With ``dsn``, each process is also named every ``label_every_s`` from ``pg_stat_activity``:
    a server's backends by their ``application_name`` (``fleetwatch api``, ``fleetwatch
    worker``), the others by their ``backend_type`` (``autovacuum worker``, ``walwriter``, ...);
    :meth:`used_by_s` splits the CPU by those names."""

    def __init__(
        self,
        database: str,
        every_s: float = 1.0,
        *,
        dsn: str | None = None,
        label_every_s: float = 10.0,
    ) -> None:
        super().__init__(name="postgres-cpu", daemon=True)
        self.database, self.every_s = database, every_s
        self.dsn, self.label_every_s = dsn, label_every_s
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._labels: dict[int, str] = {}
        self._labelled_at = float("-inf")
        self._lock = threading.Lock()
        self._done = threading.Event()

    def begin(self) -> None:
        with self._lock:
            self._base = self._read()
            self._last = dict(self._base)
        self.start()

    def _read(self) -> dict[int, float]:
        return {pid: cpu for pid, cpu in postgres_cpu_s(self.database).items() if pid >= 0}

    def sample(self) -> None:
        now = self._read()
        labels = (
            self._read_labels()
            if time.monotonic() - self._labelled_at >= self.label_every_s
            else {}
        )
        with self._lock:
            self._last.update(now)
            self._labels.update(labels)

    def _read_labels(self) -> dict[int, str]:
        self._labelled_at = time.monotonic()
        if self.dsn is None:
            return {}
        import psycopg

        query = (
            "SELECT pid, CASE WHEN application_name LIKE 'fleetwatch%' THEN application_name "
            "ELSE backend_type END FROM pg_stat_activity"
        )
        try:
            with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                return {int(pid): str(name) for pid, name in conn.execute(query)}
        except psycopg.Error:
            return {}  # a missed naming: those processes stay under their earlier names

    def used_s(self) -> float:
        self.sample()
        with self._lock:
            return sum(cpu - self._base.get(pid, 0.0) for pid, cpu in self._last.items())

    def per_process(self) -> tuple[dict[int, float], dict[int, str]]:
        """Each process's CPU since :meth:`begin`, and the names known for them."""
        self.sample()
        with self._lock:
            used = {pid: cpu - self._base.get(pid, 0.0) for pid, cpu in self._last.items()}
            return used, dict(self._labels)

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self._done.set()


@dataclass
class Parties:
    group: ServerGroup
    postgres: PostgresCpu
    generator: int
    exporters: int | None
    prometheus: _Measured | None


def _by_name(used: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, cpu in used.items():
        name = names.get(pid, "unnamed")
        out[name] = out.get(name, 0.0) + cpu
    return {name: round(cpu, 3) for name, cpu in sorted(out.items(), key=lambda kv: -kv[1])}


@dataclass
class Snapshot:
    mono: float
    cpu: dict[str, float]
    busy: float
    iowait: float
    total: float
    each_server: list[float]  # CPU of each server process (tree), in the group's order
    postgres_each: dict[int, float]  # each PostgreSQL process's CPU since PostgresCpu.begin
    postgres_names: dict[int, str]  # their names (application_name or backend_type)

    @classmethod
    def take(cls, p: Parties) -> Snapshot:
        busy, iowait, total = machine_times()
        each = [
            sum(proc_cpu_s(pid) for pid in process_tree(s.process.pid)) for s in p.group.servers
        ]
        cpu = {
            "server": sum(proc_cpu_s(pid) for pid in p.group.pids()),
            "postgres": p.postgres.used_s(),
            "prometheus": p.prometheus.cpu_s() if p.prometheus else 0.0,
            "generator": proc_cpu_s(p.generator),
            "exporters": proc_cpu_s(p.exporters) if p.exporters else 0.0,
            "harness": proc_cpu_s(os.getpid()),
        }
        postgres_each, postgres_names = p.postgres.per_process()
        return cls(time.monotonic(), cpu, busy, iowait, total, each, postgres_each, postgres_names)

    def _postgres_by(self, later: Snapshot) -> dict[str, float]:
        """PostgreSQL's CPU between the two snapshots by process name (the later names: a
        backend is named once it was seen in pg_stat_activity)."""
        used = {
            pid: cpu - self.postgres_each.get(pid, 0.0) for pid, cpu in later.postgres_each.items()
        }
        return _by_name(used, later.postgres_names)

    def until(self, later: Snapshot) -> dict[str, Any]:
        wall = later.mono - self.mono
        cpu = {k: round(later.cpu[k] - v, 3) for k, v in self.cpu.items()}
        cpus = os.cpu_count() or 1
        share = (later.busy - self.busy) / max(later.total - self.total, 1e-9)
        # Everything else on the machine (it is shared): the noise in this measurement.
        cpu["others"] = round(max(0.0, cpus * share * wall - sum(cpu.values())), 3)
        iowait = (later.iowait - self.iowait) / max(later.total - self.total, 1e-9)
        return {
            "seconds": round(wall, 3),
            "cpu_s": cpu,
            # With --api-processes N: the worker first, then each api process.
            "server_cpu_s_each": [
                round(b - a, 3) for a, b in zip(self.each_server, later.each_server, strict=True)
            ],
            "postgres_cpu_s_by": self._postgres_by(later),
            "machine_busy_pct": 100 * share,
            "machine_iowait_pct": 100 * iowait,
        }
