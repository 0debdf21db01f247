#!/usr/bin/env python
"""End-to-end ingest benchmark: the real ``fleetwatch server`` over loopback HTTP.

For each backend (a fresh SQLite file, a throwaway PostgreSQL database) this script

1. migrates the database (``fleetwatch db upgrade``), creates an agent token
   (``fleetwatch token create``) and starts ``fleetwatch server`` (uvicorn) on a free port;
2. drives it with N simulated nodes (8 GPUs each, every canonical field of
   :data:`fleetwatch.telemetry.SAMPLE_FIELDS` filled, counters increasing), each posting batches of
   K ticks with unique batch ids, closed loop (one request in flight per node), for a fixed duration
   after a warm-up, or a fixed count; request bodies are built before the timed window;
3. checks that the stored samples (the ticks of every block in ``gpu_sample_blocks``) equal what
   the server acknowledged;
4. measures the database's own bulk-load rate for the same kind of rows (the ceiling): the
   pushes' blocks, encoded beforehand, loaded by binary COPY (executemany on SQLite) one push's
   blocks per transaction, and all in one big transaction;
5. runs the server's ingest path in-process, without HTTP (token cache, ``decode_batch`` then
   ``store_batch``), step by step, to show where the time goes.

Run: ``.venv/bin/python benchmarks/ingest.py [--nodes N] [--duration S] [--only sqlite|postgres]``.
Progress goes to stderr; a markdown summary to stdout; ``--json OUT`` writes every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import json
import math
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from procstats import machine, machine_busy, postgres_cpu_s, proc_cpu_s
from rawhttp import read_response
from serverproc import (
    ServerGroup,
    ThrowawayDatabase,
    create_token,
    fleetwatch_cli,
    running_server,
)
from sqlalchemy.engine import make_url

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import authenticate
from fleetwatch.server.db.sample_blocks import encode_blocks
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.ingest.batch_decoder import decode_batch, ingest_limits
from fleetwatch.server.ingest.sample_writer import (
    BLOCK_COLUMNS,
    BLOCK_COPY_STATEMENT,
    BLOCK_COPY_TYPES,
)
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.server.repo.sample_reader import from_us, to_us
from fleetwatch.server.token_cache import TokenCache
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, SAMPLE_FIELDS

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
INTERVAL_S = 10.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Simulated nodes: realistic, complete samples with increasing counters
# --------------------------------------------------------------------------------------------


@dataclass
class _GpuState:
    uuid: str
    index: int
    energy_mj: int
    power_violation_us: int = 0
    thermal_violation_us: int = 0
    ecc_sbe_volatile_total: int = 0
    ecc_sbe_aggregate_total: int = 0
    remapped_rows_correctable: int = 0
    nvlink_crc_flit_errors_total: int = 0
    nvlink_crc_data_errors_total: int = 0
    nvlink_replay_errors_total: int = 0
    nvlink_recovery_errors_total: int = 0
    pcie_replay_total: int = 0


class SimNode:
    """One GPU node: identity plus per-GPU counter state; each tick advances the counters."""

    def __init__(self, name: str, gpus: int, start: datetime, rng: random.Random) -> None:
        self.name = name
        self.rng = rng
        self.boot_id = str(uuidlib.UUID(int=rng.getrandbits(128)))
        self.tick = 0
        self.start = start
        self.info = {
            "name": name,
            "labels": {"cluster": "bench", "rack": f"r{rng.randrange(40):02d}", "row": "3"},
            "interval_s": INTERVAL_S,
            "agent_version": "0.1.0",
            "boot_id": self.boot_id,
        }
        self.identities: list[dict[str, Any]] = []
        self.state: list[_GpuState] = []
        for index in range(gpus):
            uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{name}/{index}')}"
            self.identities.append(
                {
                    "uuid": uuid,
                    "index": index,
                    "serial": f"1652{rng.randrange(10**9):09d}",
                    "pci_bus_id": f"0000:{0x18 + 0x10 * index:02x}:00.0",
                    "name": "NVIDIA H100 80GB HBM3",
                    "driver_version": "550.90.07",
                    "vbios_version": "96.00.99.00.01",
                }
            )
            self.state.append(_GpuState(uuid, index, energy_mj=rng.randrange(10**9, 10**11)))

    def _sample(self, gpu: _GpuState, ts: datetime) -> dict[str, Any]:
        rng = self.rng
        util = min(100, max(0, int(rng.gauss(92, 8))))
        power = round(min(700.0, 90.0 + 6.0 * util + rng.uniform(-20, 20)), 3)
        gpu.energy_mj += int(power * INTERVAL_S * 1000)
        throttled = rng.random() < 0.05
        if throttled:
            gpu.power_violation_us += rng.randrange(1, 500_000)
        if rng.random() < 0.01:
            gpu.thermal_violation_us += rng.randrange(1, 100_000)
        if rng.random() < 0.02:
            gpu.ecc_sbe_volatile_total += 1
            gpu.ecc_sbe_aggregate_total += 1
        if rng.random() < 0.001:
            gpu.remapped_rows_correctable += 1
        if rng.random() < 0.03:
            gpu.nvlink_crc_flit_errors_total += rng.randrange(1, 5)
        if rng.random() < 0.005:
            gpu.nvlink_crc_data_errors_total += 1
            gpu.nvlink_replay_errors_total += 1
        if rng.random() < 0.0005:
            gpu.nvlink_recovery_errors_total += 1
        if rng.random() < 0.002:
            gpu.pcie_replay_total += 1
        temp = 38 + util // 3 + rng.randrange(-2, 3)
        return {
            "uuid": gpu.uuid,
            "ts": ts.isoformat().replace("+00:00", "Z"),
            "gpu_temp_c": temp,
            "memory_temp_c": temp + rng.randrange(3, 9),
            "power_w": power,
            "power_limit_w": 700.0,
            "energy_mj": gpu.energy_mj,
            "sm_clock_mhz": 1980 if not throttled else rng.choice((1755, 1830, 1905)),
            "mem_clock_mhz": 2619,
            "clocks_event_reasons": 4 if throttled else 0,
            "power_violation_us": gpu.power_violation_us,
            "thermal_violation_us": gpu.thermal_violation_us,
            "fan_speed_pct": rng.randrange(30, 60),
            "gpu_util_pct": util,
            "mem_copy_util_pct": max(0, min(100, util - rng.randrange(20, 50))),
            "fb_used_mib": 60_000 + rng.randrange(0, 15_000),
            "fb_total_mib": 81_559,
            "pcie_link_gen": 5,
            "pcie_link_width": 16,
            "ecc_sbe_volatile_total": gpu.ecc_sbe_volatile_total,
            "ecc_dbe_volatile_total": 0,
            "ecc_sbe_aggregate_total": gpu.ecc_sbe_aggregate_total,
            "ecc_dbe_aggregate_total": 0,
            "retired_pages_sbe": 0,
            "retired_pages_dbe": 0,
            "retired_pages_pending": False,
            "remapped_rows_correctable": gpu.remapped_rows_correctable,
            "remapped_rows_uncorrectable": 0,
            "remapped_rows_pending": False,
            "remapped_rows_failure": False,
            "nvlink_crc_flit_errors_total": gpu.nvlink_crc_flit_errors_total,
            "nvlink_crc_data_errors_total": gpu.nvlink_crc_data_errors_total,
            "nvlink_replay_errors_total": gpu.nvlink_replay_errors_total,
            "nvlink_recovery_errors_total": gpu.nvlink_recovery_errors_total,
            "pcie_replay_total": gpu.pcie_replay_total,
            "gpu_recovery_action": 0,
        }

    def samples(self, ticks: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(ticks):
            ts = self.start + timedelta(seconds=INTERVAL_S * self.tick)
            self.tick += 1
            out.extend(self._sample(gpu, ts) for gpu in self.state)
        return out

    def batch(self, ticks: int) -> dict[str, Any]:
        return {
            "batch_id": str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4)),
            "node": self.info,
            "gpus": self.identities,
            "samples": self.samples(ticks),
            "events": [],
        }


def encode(batch: dict[str, Any], use_gzip: bool) -> bytes:
    body = json.dumps(batch, separators=(",", ":")).encode()
    return gzip.compress(body, compresslevel=6) if use_gzip else body


def check_complete(sample: dict[str, Any]) -> None:
    missing = set(SAMPLE_FIELD_NAMES) - sample.keys()
    if missing:
        raise SystemExit(f"simulator leaves canonical fields out: {sorted(missing)}")


def make_fleet(prefix: str, nodes: int, gpus: int, seed: int) -> list[SimNode]:
    rng = random.Random(seed)
    # Ticks 10 s apart, starting far enough back that no run catches up with the present.
    start = (datetime.now(UTC) - timedelta(days=14)).replace(microsecond=0)
    return [
        SimNode(f"{prefix}-{i:04d}", gpus, start, random.Random(rng.getrandbits(64)))
        for i in range(nodes)
    ]


# --------------------------------------------------------------------------------------------
# The databases
# --------------------------------------------------------------------------------------------


class Backend:
    """A fresh database plus direct (non-server) access to it for checks and ceilings."""

    name: str
    url: str

    def samples(self) -> int:
        """Samples stored: the ticks of every block."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def sessions(self) -> int:
        """Sessions (connections) opened on the database so far; 0 where not known."""
        return 0

    def ceiling(
        self, blocks: Sequence[tuple[Any, ...]], batch: int | None, budget_s: float = math.inf
    ) -> int:
        """Load ``blocks`` (rows of :data:`BLOCK_COLUMNS`) in transactions of ``batch`` blocks
        (all in one when None), stopping after ``budget_s``; return the samples loaded."""
        raise NotImplementedError

    def drop(self) -> None:
        pass


_SAMPLES = "SELECT coalesce(sum(n), 0) FROM gpu_sample_blocks"
_N = BLOCK_COLUMNS.index("n")


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "bench.db"
        self.url = f"sqlite:///{self.path}"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        # The server's own settings (fleetwatch.server.db.session): WAL, synchronous=FULL.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def samples(self) -> int:
        with self._connect() as conn:
            return int(conn.execute(_SAMPLES).fetchone()[0])

    def version(self) -> str:
        return f"SQLite {sqlite3.sqlite_version}"

    @staticmethod
    def prepare(blocks: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        # What SQLAlchemy's SQLite DateTime writes for ts0 and ts1: naive UTC text.
        def text(ts: datetime) -> str:
            return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

        return [(*b[:3], text(b[3]), text(b[4]), *b[5:]) for b in blocks]

    def ceiling(
        self, blocks: Sequence[tuple[Any, ...]], batch: int | None, budget_s: float = math.inf
    ) -> int:
        sql = (
            f"INSERT INTO gpu_sample_blocks ({', '.join(BLOCK_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(BLOCK_COLUMNS))})"
        )
        step, done, loaded = batch or len(blocks), 0, 0
        conn = self._connect()
        try:
            deadline = time.perf_counter() + budget_s
            while done < len(blocks) and time.perf_counter() < deadline:
                part = blocks[done : done + step]
                conn.execute("BEGIN")
                conn.executemany(sql, part)
                conn.execute("COMMIT")
                done += len(part)
                loaded += sum(b[_N] for b in part)
        finally:
            conn.close()
        return loaded


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, server_url: str) -> None:
        self.database = ThrowawayDatabase(server_url)
        self.db_name = self.database.name
        self.admin_dsn = self.database.admin_dsn
        self.url = self.database.url
        self.dsn = self.database.dsn

    def samples(self) -> int:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(_SAMPLES).fetchone()
            return int(row[0]) if row else 0

    def version(self) -> str:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0] if row else '?'}"

    def sessions(self) -> int:
        with psycopg.connect(self.admin_dsn) as conn:
            row = conn.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = %s", (self.db_name,)
            ).fetchone()
            return int(row[0]) if row else 0

    def settings(self) -> dict[str, str]:
        names = ("shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_wal_size")
        with psycopg.connect(self.dsn) as conn:
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]

    def ceiling(
        self, blocks: Sequence[tuple[Any, ...]], batch: int | None, budget_s: float = math.inf
    ) -> int:
        statement = BLOCK_COPY_STATEMENT  # binary, as the server's
        step, done, loaded = batch or len(blocks), 0, 0
        with psycopg.connect(self.dsn) as conn:
            deadline = time.perf_counter() + budget_s
            while done < len(blocks) and time.perf_counter() < deadline:
                part = blocks[done : done + step]
                with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
                    copy.set_types(BLOCK_COPY_TYPES)
                    for block in part:
                        copy.write_row(block)
                done += len(part)
                loaded += sum(b[_N] for b in part)
        return loaded

    def drop(self) -> None:
        self.database.drop()


# --------------------------------------------------------------------------------------------
# Load generation over HTTP
# --------------------------------------------------------------------------------------------


@dataclass
class Phase:
    requests: int = 0
    rows: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    generated_late: int = 0

    def record(self, started: float, status: int, payload: bytes, ingest: bool) -> None:
        self.latencies.append(time.perf_counter() - started)
        self.requests += 1
        if status != 200:
            self.error(f"{status}: {payload[:300]!r}")
        elif ingest:
            self.rows += json.loads(payload)["accepted"]["samples"]

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text)

    @classmethod
    def merge(cls, parts: list[Phase]) -> Phase:
        out = cls()
        for p in parts:
            out.requests += p.requests
            out.rows += p.rows
            out.errors += p.errors
            out.error_samples += p.error_samples[: 5 - len(out.error_samples)]
            out.latencies += p.latencies
            out.generated_late += p.generated_late
        return out


class BodyPool:
    """Pre-built bodies per node; when a node runs out mid-run it builds more (counted)."""

    def __init__(self, fleet: list[SimNode], ticks: int, use_gzip: bool) -> None:
        self.fleet, self.ticks, self.gzip = fleet, ticks, use_gzip
        self.bodies: list[list[bytes]] = [[] for _ in fleet]
        self.rows_per_body = ticks * len(fleet[0].state)

    def fill(self, per_node: int) -> float:
        started = time.perf_counter()
        for node, bodies in zip(self.fleet, self.bodies, strict=True):
            while len(bodies) < per_node:
                bodies.append(encode(node.batch(self.ticks), self.gzip))
        return time.perf_counter() - started

    def take(self, i: int, phase: Phase) -> bytes:
        if self.bodies[i]:
            return self.bodies[i].pop()
        phase.generated_late += 1
        return encode(self.fleet[i].batch(self.ticks), self.gzip)

    def __len__(self) -> int:
        return sum(len(b) for b in self.bodies)

    def nbytes(self) -> int:
        return sum(len(x) for b in self.bodies for x in b)


CLIENTS = ("httpx", "raw")


def drive(
    client: str,
    urls: list[str],
    token: str,
    pool: BodyPool | None,
    *,
    duration: float | None,
    count: int | None,
    label: str,
    nodes: int = 0,
) -> tuple[Phase, float]:
    """Every node posts its batches back to back (one request in flight per node, each node on
    its own keep-alive connection to ``urls[node % len(urls)]``) until ``duration`` or ``count``;
    without a pool every node GETs /healthz instead (the floor cost of a request). Returns the
    merged counts and the seconds."""
    nodes = len(pool.fleet) if pool is not None else nodes
    phases = [Phase() for _ in range(nodes)]
    stop = threading.Event()
    ticker = threading.Thread(target=_progress, args=(phases, stop, label), daemon=True)
    ticker.start()
    try:
        if client == "httpx":
            elapsed = _drive_httpx(urls, token, pool, phases, duration, count)
        else:
            elapsed = asyncio.run(_drive_raw(urls, token, pool, phases, duration, count))
    finally:
        stop.set()
        ticker.join()
    return Phase.merge(phases), elapsed


def _progress(phases: list[Phase], stop: threading.Event, label: str) -> None:
    started, last_rows, last_requests = time.perf_counter(), 0, 0
    last_t = started
    while not stop.wait(2.0):
        now = time.perf_counter()
        rows, requests = sum(p.rows for p in phases), sum(p.requests for p in phases)
        errors = sum(p.errors for p in phases)
        log(
            f"  {label}: t={now - started:5.1f}s  {(rows - last_rows) / (now - last_t):9,.0f} "
            f"rows/s  {(requests - last_requests) / (now - last_t):7,.0f} req/s (last 2 s)  "
            f"errors {errors}"
        )
        last_rows, last_requests, last_t = rows, requests, now


def _headers(token: str, pool: BodyPool | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if pool is not None and pool.gzip:
        headers["Content-Encoding"] = "gzip"
    return headers


def _drive_httpx(
    urls: list[str],
    token: str,
    pool: BodyPool | None,
    phases: list[Phase],
    duration: float | None,
    count: int | None,
) -> float:
    """httpx, one sync client per node in its own thread: on this machine it costs the client
    less CPU per request than httpx.AsyncClient (measured: ~0.8 vs ~1.1 ms per request)."""
    clients = [
        httpx.Client(base_url=urls[i % len(urls)], headers=_headers(token, pool), timeout=60)
        for i in range(len(phases))
    ]
    start = threading.Barrier(len(phases) + 1)
    deadline = [math.inf]

    def worker(i: int) -> None:
        c, phase, sent = clients[i], phases[i], 0
        start.wait()
        while time.perf_counter() < deadline[0] and (count is None or sent < count):
            body = pool.take(i, phase) if pool is not None else b""
            sent += 1
            t0 = time.perf_counter()
            try:
                if pool is None:
                    answer = c.get("/healthz")
                else:
                    answer = c.post("/v1/ingest", content=body)
            except httpx.HTTPError as exc:
                phase.error(f"{type(exc).__name__}: {exc}")
                continue
            phase.record(t0, answer.status_code, answer.content, pool is not None)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(phases))]
    for t in threads:
        t.start()
    started = time.perf_counter()
    deadline[0] = started + duration if duration is not None else math.inf
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for c in clients:
        c.close()
    return elapsed


async def _drive_raw(
    urls: list[str],
    token: str,
    pool: BodyPool | None,
    phases: list[Phase],
    duration: float | None,
    count: int | None,
) -> float:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: a near-free load generator, so
    that the server, not the client, gets the machine's two cores."""
    targets = [(u.host, u.port or 80) for u in map(httpx.URL, urls)]

    def request_head(host: str, port: int) -> bytes:
        if pool is None:
            return f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
        lines = ["POST /v1/ingest HTTP/1.1", f"Host: {host}:{port}"]
        lines += [f"{k}: {v}" for k, v in _headers(token, pool).items()]
        return ("\r\n".join(lines) + "\r\n").encode()

    heads = [request_head(*target) for target in targets]
    connections = [
        await asyncio.open_connection(*targets[i % len(targets)]) for i in range(len(phases))
    ]
    started = time.perf_counter()
    deadline = started + duration if duration is not None else math.inf

    async def node_loop(i: int) -> None:
        reader, writer = connections[i]
        (host, port), head = targets[i % len(targets)], heads[i % len(targets)]
        phase, sent = phases[i], 0
        while time.perf_counter() < deadline and (count is None or sent < count):
            body = pool.take(i, phase) if pool is not None else b""
            sent += 1
            t0 = time.perf_counter()
            writer.writelines((head, b"Content-Length: %d\r\n\r\n" % len(body), body))
            try:
                status, payload, close = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                phase.error(f"{type(exc).__name__}: {exc}")
                close = True
            else:
                phase.record(t0, status, payload, pool is not None)
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
        writer.close()

    await asyncio.gather(*(node_loop(i) for i in range(len(phases))))
    return time.perf_counter() - started


def run_floor(
    group: ServerGroup, backend: Backend, client: str, args: argparse.Namespace
) -> dict[str, Any]:
    """GET /healthz the same way: what uvicorn + FastAPI + one threadpool hop cost per request."""
    pids = group.pids()
    before = _Snapshot.take(pids, backend)
    phase, elapsed = drive(
        client,
        group.urls,
        "-",
        None,
        duration=args.floor_duration,
        count=None,
        label=f"{backend.name} GET /healthz ({client})",
        nodes=args.nodes,
    )
    cpu = before.until(_Snapshot.take(pids, backend))
    result = {
        "client": client,
        "requests": phase.requests,
        "requests_per_s": round(phase.requests / elapsed, 1),
        "latency_p50_ms": round(1000 * percentile(phase.latencies, 50), 2),
        "errors": phase.errors,
        "cpu": cpu,
        **_per_request(cpu, phase.requests),
    }
    log(
        f"{backend.name} GET /healthz ({client}): {result['requests_per_s']:,} req/s, server "
        f"{result['server_cpu_us_per_request']} us CPU/request, client "
        f"{result['client_cpu_us_per_request']} us CPU/request"
    )
    return result


def _per_request(cpu: dict[str, float], requests: int) -> dict[str, float]:
    n = max(requests, 1)
    return {
        f"{who}_cpu_us_per_request": round(1e6 * cpu[f"{who}_cpu_s"] / n, 1)
        for who in ("server", "client", "postgres")
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def run_http_config(
    group: ServerGroup,
    backend: Backend,
    token: str,
    fleet: list[SimNode],
    ticks: int,
    client: str,
    args: argparse.Namespace,
    acked_before: int,
) -> dict[str, Any]:
    label = f"{backend.name} {ticks} tick(s)/batch ({client})"
    pool = BodyPool(fleet, ticks, args.gzip)
    rows_per_request = pool.rows_per_body
    # Warm-up: a small pre-built pool, topped up on the fly if the server is fast.
    warm_per_node = max(4, math.ceil(args.warmup * 2000 / rows_per_request / len(fleet)) + 4)
    if args.batches is not None:
        warm_per_node = min(warm_per_node, args.batches)
    pool.fill(warm_per_node)
    log(f"{label}: warm-up {args.warmup:g} s")
    warm, warm_s = drive(
        client, group.urls, token, pool, duration=args.warmup, count=None, label="warm-up"
    )
    if warm.errors:
        raise SystemExit(f"errors during warm-up: {warm.error_samples}")
    # Size the timed run's pre-built bodies from the warm-up rate, with room to spare.
    if args.batches is not None:
        per_node = args.batches
    else:
        warm_rate = warm.requests / max(warm_s, 1e-9)
        per_node = math.ceil(2.0 * warm_rate * args.duration / len(fleet)) + 8
    pool.bodies = [[] for _ in fleet]
    build_s = pool.fill(per_node)
    body_bytes = pool.nbytes() / max(len(pool), 1)
    log(
        f"{label}: pre-built {len(pool):,} bodies ({pool.nbytes() / 2**20:,.0f} MiB, "
        f"{body_bytes / 1024:.1f} KiB each) in {build_s:.1f} s; timed run"
    )
    pids = group.pids()
    sessions_before = backend.sessions()
    before = _Snapshot.take(pids, backend)
    phase, elapsed = drive(
        client,
        group.urls,
        token,
        pool,
        duration=None if args.batches is not None else args.duration,
        count=args.batches,
        label=label,
    )
    cpu = before.until(_Snapshot.take(pids, backend))
    sessions = backend.sessions() - sessions_before
    acked = acked_before + warm.rows + phase.rows
    stored = backend.samples()
    rows_s = phase.rows / elapsed
    result = {
        "backend": backend.name,
        "client": client,
        "ticks_per_batch": ticks,
        "rows_per_request": rows_per_request,
        "body_bytes": round(body_bytes),
        "gzip": args.gzip,
        "nodes": len(fleet),
        "elapsed_s": round(elapsed, 2),
        "requests": phase.requests,
        "rows": phase.rows,
        "rows_per_s": round(rows_s, 1),
        "values_per_s": round(rows_s * len(SAMPLE_FIELDS), 1),
        "requests_per_s": round(phase.requests / elapsed, 1),
        "latency_p50_ms": round(1000 * percentile(phase.latencies, 50), 2),
        "latency_p99_ms": round(1000 * percentile(phase.latencies, 99), 2),
        "errors": phase.errors,
        "error_samples": phase.error_samples,
        "bodies_built_during_run": phase.generated_late,
        "acknowledged_total": acked,
        "stored_total": stored,
        "stored_equals_acknowledged": stored == acked,
        "database_sessions_opened": sessions if backend.name == "postgres" else None,
        "cpu": cpu,
        **_per_request(cpu, phase.requests),
        "server_cpu_us_per_row": round(1e6 * cpu["server_cpu_s"] / max(phase.rows, 1), 2),
    }
    log(
        f"{label}: {rows_s:,.0f} rows/s, {result['requests_per_s']:,} req/s, "
        f"p50 {result['latency_p50_ms']} ms, p99 {result['latency_p99_ms']} ms, "
        f"errors {phase.errors}, stored {stored:,} == acknowledged {acked:,}: {stored == acked}; "
        f"cores: server {cpu['server_cores']}, client {cpu['client_cores']}, "
        f"postgres {cpu['postgres_cores']}, others {cpu['other_cores']}, "
        f"machine busy {cpu['machine_busy_pct']}%"
        + (f"; {sessions} new database sessions" if backend.name == "postgres" else "")
    )
    return result


@dataclass
class _Snapshot:
    wall: float
    client: float
    server: float
    postgres: dict[int, float]
    busy: float
    total: float

    @classmethod
    def take(cls, server: list[int], backend: Backend) -> _Snapshot:
        busy, total = machine_busy()
        database = backend.db_name if isinstance(backend, PostgresBackend) else None
        return cls(
            wall=time.perf_counter(),
            client=time.process_time(),
            server=sum(proc_cpu_s(p) for p in server),
            postgres=postgres_cpu_s(database),
            busy=busy,
            total=total,
        )

    def until(self, later: _Snapshot) -> dict[str, float]:
        """Cores used (CPU seconds per wall second) by each party between two snapshots."""
        wall = later.wall - self.wall
        # Sums, not per-pid deltas: a backend that exited meanwhile leaves its before-value here
        # and its whole CPU in the postmaster's reaped-children time.
        postgres = sum(later.postgres.values()) - sum(self.postgres.values())
        client, server = later.client - self.client, later.server - self.server
        cpus = os.cpu_count() or 1
        machine = cpus * (later.busy - self.busy) / max(later.total - self.total, 1e-9)
        return {
            "server_cores": round(server / wall, 2),
            "client_cores": round(client / wall, 2),
            "postgres_cores": round(postgres / wall, 2),
            # Everything else on the machine (it is shared): the noise in this measurement.
            "other_cores": round(max(0.0, machine - (server + client + postgres) / wall), 2),
            "machine_busy_pct": round(100 * machine / cpus, 1),
            "server_cpu_s": round(server, 3),
            "client_cpu_s": round(client, 3),
            "postgres_cpu_s": round(postgres, 3),
        }


# --------------------------------------------------------------------------------------------
# Ceiling: the database's own bulk load of the same rows
# --------------------------------------------------------------------------------------------


def ceiling_blocks(fleet: list[SimNode], total: int, ticks: int) -> list[tuple[Any, ...]]:
    """About ``total`` samples as the server hands them to the driver: every node's pushes of
    ``ticks`` ticks encoded (one block per GPU), as rows of :data:`BLOCK_COLUMNS` (gpu id, node
    id, boot key, ts0, ts1, n, data), a push's blocks together."""
    blocks: list[tuple[Any, ...]] = []
    gpu_ids: dict[str, int] = {}
    samples = 0
    while samples < total:
        for node_id, node in enumerate(fleet, start=1_000_000):
            push = node.samples(ticks)
            keys = [gpu_ids.setdefault(s["uuid"], 1_000_000 + len(gpu_ids)) for s in push]
            encoded = encode_blocks(
                keys,
                [to_us(datetime.fromisoformat(s["ts"])) for s in push],
                [tuple(s[n] for n in SAMPLE_FIELD_NAMES) for s in push],
            )
            blocks += [
                (b.gpu_key, node_id, node_id, from_us(b.ts0_us), from_us(b.ts1_us), b.n, b.data)
                for b in encoded
            ]
            samples += len(push)
            if samples >= total:
                break
    return blocks


def run_ceiling(
    backend: Backend, pushes: dict[int, list[tuple[Any, ...]]], gpus: int, budget_s: float
) -> dict[str, Any]:
    """``pushes``: ticks per push -> its blocks (:func:`ceiling_blocks`); a transaction of one
    push's blocks (``gpus`` of them) is one request's rows."""
    out: dict[str, Any] = {"method": "COPY" if backend.name == "postgres" else "executemany"}
    for ticks, blocks in sorted(pushes.items()):
        if isinstance(backend, SqliteBackend):
            blocks = SqliteBackend.prepare(blocks)
        size = ticks * gpus
        # Time-bounded: one transaction per push, stopping after about budget_s.
        before = backend.samples()
        started = time.perf_counter()
        loaded = backend.ceiling(blocks, gpus, budget_s)
        elapsed = time.perf_counter() - started
        assert backend.samples() - before == loaded
        out[f"batch_{size}"] = {
            "rows": loaded,
            "blocks_per_transaction": gpus,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(loaded / elapsed, 1),
        }
        log(
            f"{backend.name} ceiling, {size} rows ({gpus} blocks) per transaction: "
            f"{loaded / elapsed:,.0f} rows/s"
        )
        # Every block of the same pushes in one transaction.
        before = backend.samples()
        started = time.perf_counter()
        loaded = backend.ceiling(blocks, None)
        elapsed = time.perf_counter() - started
        assert backend.samples() - before == loaded
        out[f"one_transaction_{size}"] = out["one_transaction"] = {
            "rows": loaded,
            "blocks": len(blocks),
            "ticks_per_block": ticks,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(loaded / elapsed, 1),
        }
        log(
            f"{backend.name} ceiling, {loaded:,} rows ({len(blocks):,} blocks of {ticks} tick(s)) "
            f"in one transaction: {loaded / elapsed:,.0f} rows/s"
        )
    return out


# --------------------------------------------------------------------------------------------
# In-process: the server's ingest path without HTTP, step by step
# --------------------------------------------------------------------------------------------


class _Clock:
    """Wall and this thread's CPU time per named step."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        w, c = time.perf_counter(), time.thread_time()
        yield
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c


def run_inprocess(
    backend: Backend, token: str, fleet: list[SimNode], ticks: int, args: argparse.Namespace
) -> dict[str, Any]:
    settings = ServerSettings(database_url=backend.url)
    db = Database(make_engine(settings))
    pool = BodyPool(fleet, ticks, args.gzip)
    per_node = max(2, math.ceil(args.inproc_rows / pool.rows_per_body / len(fleet)))
    pool.fill(per_node)
    bodies = [b for node_bodies in pool.bodies for b in node_bodies]
    clock = _Clock()
    cache = TokenCache(settings.token_cache_ttl_s)
    rows = 0
    try:
        # Warm the pool, SQLAlchemy's statement cache and the token cache, like a server that
        # has been running.
        with db.read() as conn:
            cache.remember(token, lambda: authenticate(conn, token))
        for body in bodies[:20]:
            raw = gzip.decompress(body) if args.gzip else body
            batch = decode_batch(raw, ingest_limits(settings, _now()))
            store_batch(db, batch, content_sha256=hashlib.sha256(raw).hexdigest(), now=_now())
        started = time.perf_counter()
        pg_before = _live_postgres_cpu_s(backend)
        done = 0
        for body in bodies[20:]:
            if time.perf_counter() - started > args.inproc_duration:
                break
            with clock.step("auth (token cache; a query every 5 s)"):
                if cache.get(token) is None:
                    with db.read() as conn:
                        cache.remember(token, lambda: authenticate(conn, token))  # noqa: B023
            raw = body
            if args.gzip:
                with clock.step("gunzip"):
                    raw = gzip.decompress(body)
            limits = ingest_limits(settings, _now())
            with clock.step("decode + validate (decode_batch)"):
                batch = decode_batch(raw, limits)
            with clock.step("sha256"):
                digest = hashlib.sha256(raw).hexdigest()
            with clock.step("store_batch (SQL + COPY + commit)"):
                result = store_batch(db, batch, content_sha256=digest, now=_now())
            rows += result.samples
            done += 1
        elapsed = time.perf_counter() - started
        pg_after = _live_postgres_cpu_s(backend)
        pg_cpu = None if pg_after is None or pg_before is None else pg_after - pg_before
    finally:
        db.dispose()
    steps = {
        name: {
            "wall_us_per_request": round(1e6 * clock.wall[name] / done, 1),
            "cpu_us_per_request": round(1e6 * clock.cpu[name] / done, 1),
            "cpu_us_per_row": round(1e6 * clock.cpu[name] / rows, 2),
        }
        for name in clock.wall
    }
    total_cpu = sum(clock.cpu.values())
    out = {
        "backend": backend.name,
        "ticks_per_batch": ticks,
        "rows_per_request": pool.rows_per_body,
        "requests": done,
        "rows": rows,
        "rows_per_s": round(rows / elapsed, 1),
        "cpu_us_per_request": round(1e6 * total_cpu / done, 1),
        "cpu_us_per_row": round(1e6 * total_cpu / rows, 2),
        "postgres_cpu_us_per_row": round(1e6 * pg_cpu / rows, 2) if pg_cpu is not None else None,
        "steps": steps,
    }
    log(
        f"{backend.name} in-process {ticks} tick(s)/batch: {rows / elapsed:,.0f} rows/s, "
        f"PostgreSQL {_per_row(out['postgres_cpu_us_per_row'])}, "
        + ", ".join(f"{k} {v['cpu_us_per_request']} us CPU" for k, v in steps.items())
    )
    return out


def _now() -> datetime:
    return datetime.now(UTC)


def _live_postgres_cpu_s(backend: Backend) -> float | None:
    """CPU seconds of the live PostgreSQL processes working for the benchmark's database (its
    backends plus the shared WAL writer, checkpointer, ...), without the postmaster's reaped
    children: on a shared machine those are mostly other sessions'. None for SQLite."""
    if not isinstance(backend, PostgresBackend):
        return None
    return sum(cpu for pid, cpu in postgres_cpu_s(backend.db_name).items() if pid > 0)


# --------------------------------------------------------------------------------------------
# One backend, end to end
# --------------------------------------------------------------------------------------------


def agent_token(database_url: str) -> str:
    return create_token(database_url, "agent", "bench")


def bench_backend(backend: Backend, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    log(f"{backend.name}: migrating {make_url(backend.url).render_as_string()}")
    fleetwatch_cli("db", "upgrade", "--database-url", backend.url)
    token = agent_token(backend.url)
    fleet = make_fleet("bench-node", args.nodes, args.gpus, seed=args.seed)
    check_complete(fleet[0].samples(1)[0])
    fleet[0].tick = 0
    out: dict[str, Any] = {"backend": backend.name, "version": backend.version()}
    if isinstance(backend, PostgresBackend):
        out["settings"] = backend.settings()
    http: list[dict[str, Any]] = []
    env = {"FLEETWATCH_SERVER_DB_POOL_SIZE": str(args.db_pool_size)} if args.db_pool_size else {}
    with running_server(backend.url, workdir, args.server_workers, env) as server:
        log(f"{backend.name}: server pid {server.process.pid} on {server.url}")
        group = ServerGroup.one(server)
        out["floor"] = [run_floor(group, backend, client, args) for client in args.client]
        acked = 0
        for ticks in args.ticks:
            for client in args.client:
                result = run_http_config(group, backend, token, fleet, ticks, client, args, acked)
                acked = result["acknowledged_total"]
                http.append(result)
    out["http"] = http
    if not args.skip_ceiling:
        pushes = {
            ticks: ceiling_blocks(
                make_fleet("ceiling-node", args.nodes, args.gpus, args.seed + 1),
                args.ceiling_rows,
                ticks,
            )
            for ticks in sorted(set(args.ticks))
        }
        out["ceiling"] = run_ceiling(backend, pushes, args.gpus, args.ceiling_duration)
    if not args.skip_inprocess:
        fleet2 = make_fleet("inproc-node", args.nodes, args.gpus, seed=args.seed + 2)
        out["inprocess"] = [run_inprocess(backend, token, fleet2, t, args) for t in args.ticks]
    return out


def bench_api_processes(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """For each count N in ``--api-processes``: a fresh PostgreSQL database, one ``--role worker``
    process (the leader, running the write jobs) and N ``--role api`` processes on their own
    ports, the nodes' load spread over the N in turn. CPU counts every server process."""
    out = []
    for count in args.api_processes:
        backend = PostgresBackend(args.database_url)
        try:
            fleetwatch_cli("db", "upgrade", "--database-url", backend.url)
            token = agent_token(backend.url)
            fleet = make_fleet(f"api{count}-node", args.nodes, args.gpus, seed=args.seed)
            env = (
                {"FLEETWATCH_SERVER_DB_POOL_SIZE": str(args.db_pool_size)}
                if args.db_pool_size
                else {}
            )
            with contextlib.ExitStack() as stack:
                worker = stack.enter_context(running_server(backend.url, workdir, 1, env, "worker"))
                apis = [
                    stack.enter_context(running_server(backend.url, workdir, 1, env, "api"))
                    for _ in range(count)
                ]
                group = ServerGroup([worker, *apis], apis)
                log(f"api processes {count}: {', '.join(group.urls)}, worker {worker.url}")
                acked = 0
                for ticks in args.ticks:
                    for client in args.client:
                        result = run_http_config(
                            group, backend, token, fleet, ticks, client, args, acked
                        )
                        acked = result["acknowledged_total"]
                        out.append({"api_processes": count, "version": backend.version(), **result})
        finally:
            backend.drop()
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def api_processes_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| API processes (+1 worker) | client | rows/request | GPU rows/s | requests/s | p50 ms "
        "| p99 ms | errors | stored = acked | server cores (all processes) | postgres cores "
        "| others | machine busy | server CPU us/row |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        cpu = r["cpu"]
        lines.append(
            f"| {r['api_processes']} | {r['client']} | {r['rows_per_request']} "
            f"| {r['rows_per_s']:,.0f} | {r['requests_per_s']:,.0f} | {r['latency_p50_ms']} "
            f"| {r['latency_p99_ms']} | {r['errors']} "
            f"| {'yes' if r['stored_equals_acknowledged'] else 'NO'} ({r['stored_total']:,}) "
            f"| {cpu['server_cores']} | {cpu['postgres_cores']} | {cpu['other_cores']} "
            f"| {cpu['machine_busy_pct']}% | {r['server_cpu_us_per_row']} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, {m['date']}, "
        f"load average at start {m['loadavg_at_start']}",
        "",
        "| backend | client | rows/request | GPU rows/s | values/s | requests/s | p50 ms | p99 ms "
        "| errors | stored = acked | ceiling, same batch size | e2e / ceiling "
        "| ceiling, one transaction | e2e / one transaction |",
        "|" + "---|" * 14,
    ]
    for b in results["backends"]:
        ceiling = b.get("ceiling", {})
        for r in b["http"]:
            same = ceiling.get(f"batch_{r['rows_per_request']}", {}).get("rows_per_s")
            big = ceiling.get(
                f"one_transaction_{r['rows_per_request']}", ceiling.get("one_transaction", {})
            ).get("rows_per_s")
            lines.append(
                f"| {b['version']} | {r['client']} | {r['rows_per_request']} "
                f"| {r['rows_per_s']:,.0f} "
                f"| {r['values_per_s']:,.0f} | {r['requests_per_s']:,.0f} | {r['latency_p50_ms']} "
                f"| {r['latency_p99_ms']} | {r['errors']} "
                f"| {'yes' if r['stored_equals_acknowledged'] else 'NO'} "
                f"({r['stored_total']:,}) "
                f"| {_num(same)} ({ceiling.get('method', '-')}) "
                f"| {_ratio(r['rows_per_s'], same)} | {_num(big)} "
                f"| {_ratio(r['rows_per_s'], big)} |"
            )
    lines += [
        "",
        "CPU during the timed window (cores = CPU seconds per second; 'others' = the rest of the "
        "shared machine, i.e. noise):",
        "",
        "| backend | client | request | server cores | client cores | postgres cores | others "
        "| machine busy | server CPU us/request | server CPU us/row | client CPU us/request "
        "| postgres CPU us/request | new DB sessions |",
        "|" + "---|" * 13,
    ]
    for b in results["backends"]:
        rows: list[tuple[str, dict[str, Any]]] = []
        rows += [("GET /healthz", r) for r in b.get("floor", [])]
        rows += [(f"ingest, {r['rows_per_request']} rows", r) for r in b["http"]]
        for name, r in rows:
            cpu = r["cpu"]
            lines.append(
                f"| {b['backend']} | {r['client']} | {name} | {cpu['server_cores']} "
                f"| {cpu['client_cores']} "
                f"| {cpu['postgres_cores']} | {cpu['other_cores']} | {cpu['machine_busy_pct']}% "
                f"| {_num(r.get('server_cpu_us_per_request'))} "
                f"| {r.get('server_cpu_us_per_row', '-')} "
                f"| {_num(r.get('client_cpu_us_per_request'))} "
                f"| {_num(r.get('postgres_cpu_us_per_request'))} "
                f"| {_num(r.get('database_sessions_opened'))} |"
            )
    inproc = [(b, r) for b in results["backends"] for r in b.get("inprocess", [])]
    if inproc:
        steps = list(inproc[0][1]["steps"])
        lines += [
            "",
            "In-process (no HTTP), one thread: CPU microseconds per request (per row), beside the "
            "live server's CPU per request; the difference is what HTTP, uvicorn, FastAPI and "
            "the threadpool cost:",
            "",
            "| backend | rows/request | rows/s (1 thread) | "
            + " | ".join(steps)
            + " | in-process total | live server | difference | PostgreSQL (live processes) |",
            "|" + "---|" * (7 + len(steps)),
        ]
        for b, r in inproc:
            # Compared with the raw client's run where there is one (the least disturbed).
            live = next(
                (
                    h
                    for h in sorted(b["http"], key=lambda h: h["client"] != "raw")
                    if h["rows_per_request"] == r["rows_per_request"]
                ),
                None,
            )
            live_us = live["server_cpu_us_per_request"] if live else None
            cells = " | ".join(
                f"{step['cpu_us_per_request']:,.0f} ({step['cpu_us_per_row']:.1f})"
                for step in (r["steps"][s] for s in steps)
            )
            diff = f"{live_us - r['cpu_us_per_request']:,.0f}" if live_us else "-"
            lines.append(
                f"| {b['backend']} | {r['rows_per_request']} | {r['rows_per_s']:,.0f} | {cells} "
                f"| {r['cpu_us_per_request']:,.0f} ({r['cpu_us_per_row']:.1f}) "
                f"| {_num(live_us)} | {diff} | {_per_row(r.get('postgres_cpu_us_per_row'))} |"
            )
    return "\n".join(lines)


def _per_row(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us/row"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(a: float, b: float | None) -> str:
    return "-" if not b else f"{a / b:.2f}"


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=32, help="simulated nodes (default 32)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument(
        "--ticks",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 6],
        help="ticks per batch, comma-separated configurations (default 1,6)",
    )
    p.add_argument("--duration", type=float, default=20.0, help="seconds per configuration")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per configuration")
    p.add_argument("--batches", type=int, help="batches per node instead of --duration")
    p.add_argument("--gzip", action="store_true", help="send bodies gzip-compressed")
    p.add_argument("--only", choices=("sqlite", "postgres"), help="one backend only")
    p.add_argument(
        "--database-url",
        default=os.environ.get("FLEETWATCH_BENCH_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL server to create the throwaway database on "
        f"[env FLEETWATCH_BENCH_POSTGRES_URL, default {DEFAULT_POSTGRES}]",
    )
    p.add_argument(
        "--client",
        type=lambda v: [c for c in v.split(",") if c],
        default=list(CLIENTS),
        help="load generators, comma-separated: httpx (one httpx.Client per node, in threads) "
        "and/or raw (a minimal HTTP/1.1 client on asyncio; costs the machine almost nothing) "
        "[default httpx,raw]",
    )
    p.add_argument("--server-workers", type=int, default=1, help="uvicorn workers (default 1)")
    p.add_argument(
        "--api-processes",
        type=lambda s: [int(x) for x in s.split(",")],
        help="PostgreSQL only, e.g. 1,2,3: for each count, that many `--role api` processes "
        "plus one `--role worker` on a fresh database, the load spread over the API processes "
        "(after the --only backends' runs)",
    )
    p.add_argument(
        "--db-pool-size",
        type=int,
        help="server's FLEETWATCH_SERVER_DB_POOL_SIZE (default: the product's default)",
    )
    p.add_argument("--ceiling-rows", type=int, default=100_000, help="samples for the ceiling")
    p.add_argument(
        "--ceiling-duration", type=float, default=5.0, help="seconds per batched ceiling"
    )
    p.add_argument("--inproc-rows", type=int, default=60_000, help="rows for the in-process run")
    p.add_argument("--inproc-duration", type=float, default=8.0, help="seconds per in-process run")
    p.add_argument(
        "--floor-duration", type=float, default=3.0, help="seconds of GET /healthz (floor)"
    )
    p.add_argument("--skip-ceiling", action="store_true")
    p.add_argument("--skip-inprocess", action="store_true")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--json", type=Path, help="write all results to this JSON file")
    p.add_argument("--smoke", action="store_true", help="seconds a backend, for the test suite")
    args = p.parse_args(argv)
    if args.smoke:  # every part once, at toy sizes; checked as any run is (stored == acked)
        args.nodes, args.gpus, args.ticks, args.batches, args.warmup = 2, 2, [2], 3, 0.0
        args.ceiling_rows, args.ceiling_duration, args.inproc_rows = 200, 0.2, 200
        args.inproc_duration, args.floor_duration = 0.2, 0.2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = set(args.client) - set(CLIENTS)
    if unknown:
        raise SystemExit(f"unknown --client {sorted(unknown)}; choose from {', '.join(CLIENTS)}")
    results: dict[str, Any] = {"machine": machine(), "args": _jsonable(vars(args))}
    log(
        f"machine: {results['machine']['cpus']} CPUs, {results['machine']['cpu_model']}, "
        f"load average {results['machine']['loadavg_at_start']}"
    )
    backends: list[dict[str, Any]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="fleetwatch-bench-") as tmp:
        workdir = Path(tmp)
        names = [args.only] if args.only else ["sqlite", "postgres"]
        for name in names:
            backend: Backend = (
                SqliteBackend(workdir) if name == "sqlite" else PostgresBackend(args.database_url)
            )
            try:
                result = bench_backend(backend, workdir, args)
            finally:
                backend.drop()
            backends.append(result)
            ok = ok and all(
                r["errors"] == 0 and r["stored_equals_acknowledged"] for r in result["http"]
            )
        if args.api_processes:
            results["api_processes"] = bench_api_processes(args, workdir)
            ok = ok and all(
                r["errors"] == 0 and r["stored_equals_acknowledged"]
                for r in results["api_processes"]
            )
    results["backends"] = backends
    results["ok"] = ok
    print(markdown(results))
    if args.api_processes:
        print("\n" + api_processes_markdown(results["api_processes"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        log(f"results written to {args.json}")
    return 0 if ok else 1


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


if __name__ == "__main__":
    sys.exit(main())
