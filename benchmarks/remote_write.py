#!/usr/bin/env python
"""Issue 38 item 4: what a GPU row costs through Prometheus remote write, beside the agent path
and beside Prometheus itself, in one run.

The fleet: ``--nodes`` nodes of ``--gpus`` GPUs, each node's dcgm-exporter page made from a real
captured one (``--page``; its richest GPU, relabelled per node and GPU: ``gpu``, ``UUID``,
``device``, ``Hostname``), scraped every ``--interval`` s. A GPU row is one GPU's readings at one
instant. The same readings go three ways:

a. **remote write**: each scrape's series as Prometheus sends them
   (:func:`fleetwatch.remote_write.exposition.scrape_series`), in WAL order, cut into
   requests of ``--samples-per-send`` samples (a range: a shard flushes what it holds) and
   encoded with :func:`~fleetwatch.remote_write.wire.encode_write_request`, to
   ``POST /api/v1/write``. The server stages the pieces; its sealer (every second, a settle
   time after a GPU's last piece) stores each row through ``write_batch``. Measured until every
   row is in ``gpu_sample_blocks``, so the sealer's CPU is counted;
b. **agent path**: the same pages read as the agent reads them (``parse_dcgm_scrape``, the
   agent's tick and combine code), one push per ``--push-interval``, to ``POST /v1/ingest``;
c. **Prometheus**: the real ``prometheus`` binary (``/usr/bin/prometheus``) scraping the same
   pages every ``--prometheus-interval`` s from this process; its CPU over the GPU rows served
   in a ``--prometheus-window`` after two warm-up rounds (its series exist by then).

(a) and (b) run one after the other on one real ``fleetwatch server`` (product defaults,
background jobs on) and one throwaway PostgreSQL database, each after a warm-up scrape that
registers its nodes. CPU is read from /proc: the server's process, and PostgreSQL's backends of
the database plus its shared processes (``procstats.postgres_cpu_s``); the load generator's is
not counted. The figure is CPU per GPU row stored; the window's idle cost (background passes) is
in it, and the idle rate measured before the phase is reported beside it.

Run: ``.venv/bin/python benchmarks/remote_write.py [--nodes 200] [--scrapes 12] [--json F]``;
``--smoke`` for seconds at toy sizes. Progress on stderr, the table on stdout. The exit status is
1 when a path did not store exactly one row per GPU per scrape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from procstats import machine, postgres_cpu_s, proc_cpu_s
from rawhttp import RawPool
from scale_prometheus import Prometheus, write_config
from serverproc import (
    ServerGroup,
    ThrowawayDatabase,
    create_token,
    fleetwatch_cli,
    running_server,
)

from fleetwatch.agent.batching import combine_ticks, tick_body
from fleetwatch.agent.collectors.base import readings_to_collection
from fleetwatch.agent.loop import build_batch, encode
from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_scrape
from fleetwatch.agent.spool_staging import StagedTick
from fleetwatch.remote_write.exposition import scrape_series
from fleetwatch.remote_write.wire import Series, encode_write_request
from fleetwatch.telemetry import NodeInfo

HERE = Path(__file__).resolve().parent
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_PAGE = HERE.parent.parent / "shared/fixtures/dcgm_exporter/metrics"
DEFAULT_PAGE = DEFAULT_PAGE / "datadog__dcgm_tests_fixtures_metrics.txt"
REMOTE_WRITE_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
_ROWS = "SELECT coalesce(sum(n), 0) FROM gpu_sample_blocks"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The fleet's pages, made from one real page
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    family: str  # the "# HELP" and "# TYPE" lines
    name: str
    labels: str  # with {gpu}, {uuid}, {host} in place of the captured values
    value: float


class FleetPages:
    """Node ``i``'s dcgm-exporter page at scrape ``k``: the captured GPU's series for each of
    the node's GPUs, grouped by metric family as dcgm-exporter writes them. Values move as a
    working GPU's do (temperature and power within a few percent, the energy counter by the
    power drawn); the rest stay as captured (no errors, as on most GPUs most of the time)."""

    def __init__(self, page: str, nodes: int, gpus: int, interval_s: float) -> None:
        self.nodes, self.gpus, self.interval_s = nodes, gpus, interval_s
        self.lines = _template(page)
        if not self.lines:
            raise SystemExit("the page holds no series with a UUID label")
        self.power = next((x.value for x in self.lines if x.name == "DCGM_FI_DEV_POWER_USAGE"), 0)

    def host(self, i: int) -> str:
        return f"rw-node-{i:04d}"

    def uuid(self, i: int, g: int) -> str:
        return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{self.host(i)}/{g}')}"

    def render(self, i: int, k: int) -> str:
        host, out, family = self.host(i), [], ""
        for line in self.lines:
            if line.family != family:
                family = line.family
                out.append(family)
            for g in range(self.gpus):
                labels = line.labels.format(gpu=g, uuid=self.uuid(i, g), host=host)
                out.append(f"{line.name}{labels} {self._value(line, i, g, k)}\n")
        return "".join(out)

    def _value(self, line: _Line, i: int, g: int, k: int) -> str:
        jitter = random.Random(zlib.crc32(f"{line.name}/{i}/{g}/{k}".encode()))
        if line.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
            return str(int(line.value + k * self.power * self.interval_s * 1000))
        if line.name == "DCGM_FI_DEV_GPU_TEMP":
            return str(int(line.value) + jitter.randint(-1, 1))
        if line.name == "DCGM_FI_DEV_POWER_USAGE":
            return f"{line.value * jitter.uniform(0.95, 1.05):.6f}"
        return f"{line.value:g}" if line.value == int(line.value) else f"{line.value:f}"


def _template(page: str) -> list[_Line]:
    """The sample lines of the page's GPU with the most series, its values and family headers."""
    by_uuid: dict[str, list[_Line]] = {}
    header: list[str] = []
    for text in page.splitlines():
        if text.startswith("# HELP"):
            header = [text]
        elif text.startswith("# TYPE"):
            header.append(text)
        elif (uuid := _UUID.search(text)) is not None:
            name, rest = text.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            labels = "{{" + labels.replace("{", "{{").replace("}", "}}") + "}}"
            for label, placeholder in _RELABEL:
                labels = re.sub(f'\\b{label}="[^"]*"', f'{label}="{placeholder}"', labels)
            family = "".join(f"{h}\n" for h in header)
            by_uuid.setdefault(uuid[1], []).append(_Line(family, name, labels, float(value)))
    return max(by_uuid.values(), key=len, default=[])


_UUID = re.compile(r'\bUUID="([^"]*)"')
# dcgm-exporter's labels that name the GPU and its node, and what they become for node/GPU.
_RELABEL = (("gpu", "{gpu}"), ("UUID", "{uuid}"), ("device", "nvidia{gpu}"), ("Hostname", "{host}"))


# --------------------------------------------------------------------------------------------
# The bodies each path sends, built before the timed window
# --------------------------------------------------------------------------------------------


def scrape_ms(pages: FleetPages, t0_ms: int, i: int, k: int) -> int:
    """When node ``i``'s scrape ``k`` happened: Prometheus spreads its targets over the interval."""
    return t0_ms + int(1000 * pages.interval_s * (k + i / pages.nodes))


def remote_write_bodies(
    pages: FleetPages, t0_ms: int, scrapes: range, per_send: tuple[int, int], rng: random.Random
) -> tuple[list[bytes], int]:
    """The requests Prometheus would send for ``scrapes`` of every node: the series in the order
    its WAL holds them (scrape by scrape), cut every ``per_send`` samples; and how many series."""
    series: list[Series] = []
    for k in scrapes:
        for i in range(pages.nodes):
            target = {"job": "dcgm-exporter", "instance": f"{pages.host(i)}:9400"}
            series += scrape_series(pages.render(i, k), scrape_ms(pages, t0_ms, i, k), target)
    bodies, start = [], 0
    while start < len(series):
        size = rng.randint(*per_send)
        bodies.append(encode_write_request(series[start : start + size]))
        start += size
    return bodies, len(series)


def agent_bodies(
    pages: FleetPages, t0_ms: int, scrapes: range, ticks_per_push: int, push_interval_s: float
) -> list[bytes]:
    """The pushes an agent of each node sends for ``scrapes``: each scrape read, staged and
    combined with the agent's own code (``ticks_per_push`` collections a push), gzip JSON."""
    out: list[tuple[int, bytes]] = []
    for i in range(pages.nodes):
        node = NodeInfo(
            name=pages.host(i),
            interval_s=pages.interval_s,
            push_interval_s=push_interval_s if ticks_per_push > 1 else None,
            agent_version="bench",
            boot_id=str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, pages.host(i))),
        )
        ticks: list[StagedTick] = []
        for n, k in enumerate(scrapes):
            ts_ms = scrape_ms(pages, t0_ms, i, k)
            scrape = parse_dcgm_scrape(pages.render(i, k))
            when = datetime.fromtimestamp(ts_ms / 1000, UTC)
            tick = build_batch(node, readings_to_collection(scrape.readings, when), "staged")
            ticks.append(StagedTick(k, ts_ms / 1000, len(tick.samples), 0, tick_body(tick)))
            if len(ticks) == ticks_per_push or n == len(scrapes) - 1:
                for batch in combine_ticks(
                    ticks, node=node, carrier=str(uuidlib.uuid4()), extra_events=[]
                ):
                    out.append((ts_ms, encode(batch)))
                ticks = []
    return [body for _, body in sorted(out, key=lambda pair: pair[0])]


# --------------------------------------------------------------------------------------------
# Sending and measuring (a) and (b)
# --------------------------------------------------------------------------------------------


def send(
    url: str, path: str, headers: dict[str, str], bodies: list[bytes], connections: int
) -> list[str]:
    """Every body, ``connections`` in flight (Prometheus' shards, the fleet's agents); a 5xx is
    sent again after a pause, as Prometheus and the agent retry it. The 5xx answers met."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    retried: list[str] = []

    async def run() -> None:
        pool = RawPool(host, int(port), connections, headers)
        queue = iter(bodies)

        async def worker() -> None:
            for body in queue:
                for attempt in range(10):
                    status, answer = await pool.post(path, body)
                    if status < 500:
                        break
                    retried.append(f"{status}: {answer[:200].decode(errors='replace')}")
                    await asyncio.sleep(0.03 * 2**attempt)  # Prometheus' min_backoff, doubled
                if status >= 300:
                    raise SystemExit(f"{path} answered {status}: {answer[:300]!r}")

        try:
            await asyncio.gather(*(worker() for _ in range(connections)))
        finally:
            pool.close()

    asyncio.run(run())
    return retried


def stored_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(_ROWS).fetchone()
        return int(row[0]) if row else 0


def wait_rows(dsn: str, expected: int, timeout_s: float) -> int:
    """Poll until ``expected`` GPU rows are stored (the sealer works a settle time behind)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = stored_rows(dsn)
        if rows >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.25)


@dataclass
class Cpu:
    wall: float
    server: float
    postgres: float

    @classmethod
    def take(cls, group: ServerGroup, database: str) -> Cpu:
        return cls(
            time.monotonic(),
            sum(proc_cpu_s(pid) for pid in group.pids()),
            # Sums, not per-pid values: an exited backend's CPU is in the postmaster's children.
            sum(postgres_cpu_s(database).values()),
        )

    def until(self, later: Cpu) -> dict[str, float]:
        return {
            "wall_s": round(later.wall - self.wall, 2),
            "server_cpu_s": round(later.server - self.server, 3),
            "postgres_cpu_s": round(later.postgres - self.postgres, 3),
        }


@dataclass
class Route:
    name: str
    endpoint: str
    headers: dict[str, str]
    warm: list[bytes]
    bodies: list[bytes]
    rows: int  # GPU rows in ``bodies``
    samples: int  # values sent (remote write: series samples; agent: GPU rows)
    connections: int  # requests in flight


def measure_path(
    path: Route,
    group: ServerGroup,
    db: ThrowawayDatabase,
    token: str,
    args: argparse.Namespace,
    warm_rows: int,
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", **path.headers}
    url = group.urls[0]
    before_warm = stored_rows(db.dsn)
    log(f"{path.name}: warm-up, {len(path.warm)} requests ({warm_rows:,} rows)")
    send(url, path.endpoint, headers, path.warm, path.connections)
    timeout = args.settle + 120
    if wait_rows(db.dsn, before_warm + warm_rows, timeout) < before_warm + warm_rows:
        tail = group.servers[0].log_path.read_text()[-3000:]
        raise SystemExit(f"{path.name}: the warm-up's rows not stored in {timeout:g} s:\n{tail}")
    idle_before = Cpu.take(group, db.name)
    time.sleep(args.idle)
    start = Cpu.take(group, db.name)
    idle = idle_before.until(start)
    log(f"{path.name}: {len(path.bodies):,} requests, {path.rows:,} rows; timed until stored")
    retried = send(url, path.endpoint, headers, path.bodies, path.connections)
    sent = time.monotonic()
    expected = before_warm + warm_rows + path.rows
    stored = wait_rows(db.dsn, expected, timeout) - before_warm - warm_rows
    cpu = start.until(Cpu.take(group, db.name))
    rows = max(stored, 1)
    server_us = round(1e6 * cpu["server_cpu_s"] / rows, 1)
    postgres_us = round(1e6 * cpu["postgres_cpu_s"] / rows, 1)
    result: dict[str, Any] = {
        "path": path.name,
        "requests": len(path.bodies),
        "samples_per_request": round(path.samples / max(len(path.bodies), 1), 1),
        "rows_sent": path.rows,
        "rows_stored": stored,
        "stored_equals_sent": stored == path.rows,
        "send_s": round(sent - start.wall, 2),
        "retried_5xx": len(retried),
        "retried_5xx_first": retried[:3],
        **cpu,
        "idle": idle,
        "server_us_per_row": server_us,
        "postgres_us_per_row": postgres_us,
        "total_us_per_row": round(server_us + postgres_us, 1),
    }
    idle_cores = (idle["server_cpu_s"] + idle["postgres_cpu_s"]) / max(idle["wall_s"], 1e-9)
    # What the window would have cost with nothing sent, at the rate measured before it.
    result["idle_us_per_row"] = round(1e6 * idle_cores * cpu["wall_s"] / rows, 1)
    log(
        f"{path.name}: {stored:,} of {path.rows:,} rows stored in {cpu['wall_s']:.1f} s "
        f"(sent in {result['send_s']:.1f} s); server {cpu['server_cpu_s']:.2f} CPU-s, "
        f"PostgreSQL {cpu['postgres_cpu_s']:.2f}; {result['total_us_per_row']:.1f} µs/row; "
        f"idle {idle_cores:.3f} cores before; {len(retried)} answered 5xx, sent again"
    )
    return result


def fleetwatch_side(
    args: argparse.Namespace, pages: FleetPages, workdir: Path
) -> tuple[list[dict[str, Any]], str]:
    rng = random.Random(args.seed)
    per_send = (args.samples_per_send[0], args.samples_per_send[-1])
    # Scrape 0 is the warm-up; the last scrape a few intervals before now (the server refuses
    # samples from its future and, for remote write, older than its dedup window).
    t0_ms = int(1000 * (time.time() - (args.scrapes + 3) * args.interval))
    measured = range(1, args.scrapes + 1)
    rows = args.nodes * args.gpus * args.scrapes
    log("building the remote-write requests and the agents' pushes")
    built = time.perf_counter()
    rw_warm, _ = remote_write_bodies(pages, t0_ms, range(1), per_send, rng)
    rw_bodies, rw_samples = remote_write_bodies(pages, t0_ms, measured, per_send, rng)
    ticks = max(1, round(args.push_interval / args.interval))
    agent_warm = agent_bodies(pages, t0_ms, range(1), 1, args.push_interval)
    agent = agent_bodies(pages, t0_ms, measured, ticks, args.push_interval)
    log(f"built in {time.perf_counter() - built:.1f} s")
    paths = [
        Route(
            "remote write",
            "/api/v1/write",
            REMOTE_WRITE_HEADERS,
            rw_warm,
            rw_bodies,
            rows,
            rw_samples,
            args.connections,
        ),
        Route(
            "agent path",
            "/v1/ingest",
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            agent_warm,
            agent,
            rows,
            rows,
            # Each agent pushes on its own: the server's group commit sees them together.
            args.agent_connections or args.nodes,
        ),
    ]
    db = ThrowawayDatabase(args.database_url)
    try:
        log(f"database {db.name}: migrating, token")
        fleetwatch_cli("db", "upgrade", "--database-url", db.url)
        token = create_token(db.url, "agent", "remote-write-bench")
        env = {
            "FLEETWATCH_SERVER_REMOTE_WRITE_SETTLE_S": f"{args.settle:g}",
            "FLEETWATCH_SERVER_REMOTE_WRITE_SCRAPE_INTERVAL_S": f"{args.interval:g}",
        }
        with running_server(db.url, workdir, 1, env) as server:
            group = ServerGroup.one(server)
            results = [
                measure_path(p, group, db, token, args, args.nodes * args.gpus) for p in paths
            ]
        with psycopg.connect(db.dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            version = f"PostgreSQL {row[0] if row else '?'}"
    finally:
        db.drop()
    return results, version


# --------------------------------------------------------------------------------------------
# (c) Prometheus scraping the same pages
# --------------------------------------------------------------------------------------------


class PageServer(ThreadingHTTPServer):
    """``GET /metrics/<i>``: node ``i``'s page at the current scrape, gzip when asked for;
    counts the GPU rows it served."""

    daemon_threads = True

    def __init__(self, pages: FleetPages, interval_s: float) -> None:
        super().__init__(("127.0.0.1", 0), _PageHandler)
        self.pages, self.interval_s, self.epoch = pages, interval_s, time.time()
        self.served_rows = 0
        self.lock = threading.Lock()


class _PageHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PageServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        pages = self.server.pages
        try:
            i = int(self.path.rsplit("/", 1)[1])
        except ValueError:
            i = -1
        if not 0 <= i < pages.nodes:
            self.send_error(404)
            return
        k = int((time.time() - self.server.epoch) / self.server.interval_s)
        body = pages.render(i, k).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        with self.server.lock:
            self.server.served_rows += pages.gpus

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def prometheus_binary(args: argparse.Namespace) -> str | None:
    found = args.prometheus or shutil.which("prometheus") or "/usr/bin/prometheus"
    if Path(found).exists():
        return found
    if os.environ.get("FLEETWATCH_REQUIRE_TOOLS") == "1":
        raise SystemExit(f"prometheus not found at {found} (FLEETWATCH_REQUIRE_TOOLS=1)")
    log(f"prometheus not found at {found}: no Prometheus figures")
    return None


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.1)


@dataclass
class PrometheusRun:
    prometheus: Prometheus
    pages: PageServer
    binary: str


@contextlib.contextmanager
def prometheus_running(
    args: argparse.Namespace, pages: FleetPages, binary: str, workdir: Path
) -> Iterator[PrometheusRun]:
    """Prometheus scraping every node's page from this process, one target a node."""
    with contextlib.ExitStack() as stack:
        server = PageServer(pages, args.prometheus_interval)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        config = write_config(
            workdir / "prometheus.yml",
            server.server_address[1],
            pages.nodes,
            args.prometheus_interval,
        )
        prom = Prometheus(binary, config, workdir / "tsdb", workdir / "prometheus.log")
        stack.callback(prom.stop)
        prom.wait_ready()
        log(f"prometheus up at {prom.url}, {pages.nodes} targets")
        yield PrometheusRun(prom, server, binary)


def measure_prometheus(run: PrometheusRun, args: argparse.Namespace) -> dict[str, Any]:
    """Its CPU per GPU row served over the window, after two rounds of every target (its series
    are made by then, as FleetWatch's nodes are by the warm-up)."""
    interval, prom, server = args.prometheus_interval, run.prometheus, run.pages
    rounds = server.pages.nodes * server.pages.gpus
    # Prometheus applies new targets a few seconds after its start (5 s at most).
    _wait(lambda: server.served_rows >= 2 * rounds, 4 * interval + 60, "warm-up scrapes")
    cpu0, rows0, wall0 = prom.cpu_s(), server.served_rows, time.time()
    time.sleep(args.prometheus_window)
    cpu1, rows1, wall1 = prom.cpu_s(), server.served_rows, time.time()
    rows = rows1 - rows0
    # Read after the CPU: answering a query is Prometheus' CPU too.
    stored = prom.gpu_rows(wall0, wall1)
    health = prom.scrape_health(wall0, wall1)
    version = subprocess.run([run.binary, "--version"], capture_output=True, text=True, check=False)
    result = {
        "version": (version.stdout or version.stderr).splitlines()[0],
        "scrape_interval_s": interval,
        "window_s": round(wall1 - wall0, 2),
        "rows_served": rows,
        "rows_stored_in_window": stored,
        "scrape_health": health,
        "cpu_s": round(cpu1 - cpu0, 3),
        "us_per_row": round(1e6 * (cpu1 - cpu0) / max(rows, 1), 1),
    }
    log(
        f"Prometheus: {rows:,} GPU rows served in {result['window_s']:.1f} s ({stored:,} in its "
        f"TSDB), {result['cpu_s']:.2f} CPU-s, {result['us_per_row']:.1f} µs/row"
    )
    return result


# --------------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    paths = results["paths"]
    agent = next(p for p in paths if p["path"] == "agent path")
    prom = results.get("prometheus")
    prom_cell = f"{prom['us_per_row']:.1f}" if prom else "not measured"
    lines = [
        f"{results['fleet']['nodes']} nodes x {results['fleet']['gpus']} GPUs, "
        f"{results['fleet']['scrapes']} scrapes {results['fleet']['interval_s']:g} s apart, "
        f"{results['fleet']['series_per_gpu']} series a GPU; {results['postgres']}",
        "",
        "| path | rows | server CPU µs/row | PostgreSQL CPU µs/row | total µs/row "
        "| ratio to agent path | Prometheus µs/row |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in paths:
        ratio = (
            p["total_us_per_row"] / agent["total_us_per_row"] if agent["total_us_per_row"] else 0
        )
        lines.append(
            f"| {p['path']} | {p['rows_stored']:,} | {p['server_us_per_row']:.1f} "
            f"| {p['postgres_us_per_row']:.1f} | {p['total_us_per_row']:.1f} | {ratio:.2f} "
            f"| {prom_cell} |"
        )
    if prom:
        lines.append(
            f"\nPrometheus ({prom['version'].split(' (')[0]}): {prom['rows_served']:,} GPU rows "
            f"scraped in {prom['window_s']:.0f} s, a scrape every {prom['scrape_interval_s']} s; "
            f"{prom['rows_stored_in_window']:,} in its TSDB; {prom['cpu_s']:.2f} CPU-s"
        )
    for p in paths:
        lines.append(
            f"\n{p['path']}: {p['requests']:,} requests of {p['samples_per_request']:,} "
            f"{'samples' if p['path'] == 'remote write' else 'rows'}, stored "
            f"{p['rows_stored']:,} == sent {p['rows_sent']:,}: {p['stored_equals_sent']}; "
            f"{p['retried_5xx']} answered 5xx and sent again; "
            f"{p['wall_s']:.1f} s until stored (sent in {p['send_s']:.1f} s); of its "
            f"{p['total_us_per_row']:.1f} µs/row, {p['idle_us_per_row']:.1f} is what the server "
            f"and PostgreSQL used idle over as long a window (measured before it)"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--gpus", type=int, default=8, help="GPUs a node (8)")
    p.add_argument("--scrapes", type=int, default=12, help="measured scrapes of every node (12)")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes (15)")
    p.add_argument("--push-interval", type=float, default=60.0, help="agent pushes (60 s)")
    p.add_argument(
        "--samples-per-send",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[500, 2000],
        help="samples a remote-write request, MIN,MAX (500,2000)",
    )
    p.add_argument(
        "--connections", type=int, default=4, help="remote-write requests in flight (4 shards)"
    )
    p.add_argument(
        "--agent-connections", type=int, help="pushes in flight (default: one per node, as agents)"
    )
    p.add_argument(
        "--settle", type=float, default=10.0, help="the server's remote_write_settle_s (10)"
    )
    p.add_argument("--idle", type=float, default=5.0, help="idle seconds measured before each")
    p.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="a captured exporter page")
    p.add_argument(
        "--database-url", default=os.environ.get("FLEETWATCH_BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    )
    p.add_argument("--prometheus", help="the prometheus binary (default: on PATH)")
    p.add_argument("--prometheus-interval", type=int, default=5, help="its scrapes, s (5)")
    p.add_argument("--prometheus-window", type=float, default=60.0, help="measured s (60)")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--json", type=Path, help="write every figure to this JSON file")
    p.add_argument("--smoke", action="store_true", help="seconds, toy sizes, for the test suite")
    args = p.parse_args(argv)
    if args.smoke:
        args.nodes, args.gpus, args.scrapes, args.settle, args.idle = 2, 2, 2, 1.0, 0.2
        args.prometheus_interval, args.prometheus_window = 1, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.page.is_file():
        raise SystemExit(f"no page at {args.page}: pass --page (a captured dcgm-exporter page)")
    pages = FleetPages(args.page.read_text(), args.nodes, args.gpus, args.interval)
    results: dict[str, Any] = {
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "fleet": {
            "nodes": args.nodes,
            "gpus": args.gpus,
            "scrapes": args.scrapes,
            "interval_s": args.interval,
            "series_per_gpu": len(pages.lines),
            "page": args.page.name,
        },
    }
    log(
        f"machine: {results['machine']['cpus']} CPUs, {results['machine']['cpu_model']}, "
        f"load average {results['machine']['loadavg_at_start']}"
    )
    binary = prometheus_binary(args)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fw-rw-")))
        prometheus = None
        if binary is not None and args.smoke:
            # Started first, so that its few seconds of start overlap the database's migration
            # (a smoke run has seconds); a measured run keeps it apart from FleetWatch's window.
            prometheus = stack.enter_context(prometheus_running(args, pages, binary, workdir))
        results["paths"], results["postgres"] = fleetwatch_side(args, pages, workdir)
        if binary is not None and prometheus is None:
            prometheus = stack.enter_context(prometheus_running(args, pages, binary, workdir))
        if prometheus is not None:
            results["prometheus"] = measure_prometheus(prometheus, args)
    results["ok"] = all(p["stored_equals_sent"] for p in results["paths"])
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        log(f"results written to {args.json}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
