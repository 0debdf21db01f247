"""How big /metrics is and how long Prometheus waits for it, for a fleet-scale database.

Fills a fresh database (SQLite file, or a throwaway PostgreSQL database with ``--postgres``) in
bulk SQL with what a fleet of N nodes x 8 GPUs leaves behind: every node and GPU with its newest
sample (all canonical fields), node labels (cluster, row, rack), an application Xid on every
10th node and a double-bit-error Xid (48, a fatal verdict) on every ``--fatal-every``-th GPU,
straggler ratios of the newest window for every node (jobs of 64 nodes) and a slowness score per
node, a fitted risk model, ``--ports-per-node`` network ports per node (InfiniBand, 400 Gb/s,
with counters and rates; a port down on every 100th node, one at 200 Gb/s on every 50th), a
corrected machine check on every 20th node and a fatal SXid on every 500th. Then it starts the
real ``fleetwatch server`` on it (background jobs off, so that nothing else competes for the 2
cores: the one assessment is requested through ``GET /v1/risk``), and times scrapes over loopback
HTTP, as Prometheus makes them:

- the default page (``/metrics``): cold, repeated, gzip; and after every GPU and node reported
  anew (a bulk UPDATE of ``gpus`` and ``nodes``; the cache TTL waited out);
- one shard (``/metrics?shard=3&shards=16``, and of other shard counts with ``--shards``): the
  same.

It prints the page sizes, the bytes per metric family and the scrape times, and the server's
peak RSS (VmHWM). Run it against an older checkout with ``--shard-scrapes 0`` (its /metrics
ignores the shard parameters and would send the whole fleet again).

    .venv/bin/python benchmarks/metrics.py [--gpus 100000] [--shards 16,32] [--postgres]
"""

from __future__ import annotations

import argparse
import gzip as gzip_module
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pandas as pd
from sqlalchemy import insert, update
from sqlalchemy.engine import make_url

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import (
    events,
    gpus,
    node_ports,
    node_slowness,
    nodes,
    straggler_state,
)
from fleetwatch.server.repo.models import store_model

GPUS_PER_NODE = 8
NODES_PER_JOB = 64
CHUNK = 2000
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _sample(tick: int) -> dict[str, Any]:
    """Every canonical field, as ``gpus.latest`` holds the newest sample."""
    return {
        "gpu_temp_c": 60.0 + tick % 7,
        "memory_temp_c": 66.0,
        "power_w": 612.5,
        "power_limit_w": 700.0,
        "energy_mj": 10_000_000 + tick,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "clocks_event_reasons": 0x4,
        "power_violation_us": tick,
        "thermal_violation_us": 0,
        "fan_speed_pct": 40.0,
        "gpu_util_pct": 97.0,
        "mem_copy_util_pct": 40.0,
        "fb_used_mib": 71_000.0,
        "fb_total_mib": 81_559.0,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
        "ecc_sbe_volatile_total": tick,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": tick,
        "ecc_dbe_aggregate_total": 0,
        "retired_pages_sbe": 0,
        "retired_pages_dbe": 0,
        "retired_pages_pending": False,
        "remapped_rows_correctable": 1,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "nvlink_crc_flit_errors_total": tick,
        "nvlink_crc_data_errors_total": 0,
        "nvlink_replay_errors_total": 0,
        "nvlink_recovery_errors_total": 0,
        "pcie_replay_total": 0,
        "gpu_recovery_action": 0,
    }


# What an HCA's counters/ folder holds besides the five error counters the metrics export.
_OTHER_COUNTERS = (
    "excessive_buffer_overrun_errors", "local_link_integrity_errors", "multicast_rcv_packets",
    "multicast_xmit_packets", "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_packets", "port_xmit_wait",
    "unicast_rcv_packets", "unicast_xmit_packets", "VL15_dropped",
)  # fmt: skip
_ERROR_COUNTERS = (
    "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
)  # fmt: skip


def port_rows(n_nodes: int, per_node: int, now: datetime) -> list[dict[str, Any]]:
    """Each node's ports as ``node_ports`` keeps them: newest reading, counters, their rates."""
    counters = dict.fromkeys(_OTHER_COUNTERS, 1000) | dict.fromkeys(_ERROR_COUNTERS, 3)
    rates = {"counters": {name: {"per_s": 0.0, "increase": 0, "reset": False}
                          for name in counters}}  # fmt: skip
    rows = []
    for n in range(n_nodes):
        for i in range(per_node):
            down = n % 100 == 0 and i == per_node - 1
            rows.append({
                "node_id": n + 1, "device": f"mlx5_{i}", "port": 1, "ts": now,
                "boot_id": "boot-1", "link_layer": "InfiniBand",
                "node_guid": f"0a7f:bc12:{n % 65536:04x}:{i:04x}", "netdev": f"ib{i}",
                "state": "DOWN" if down else "ACTIVE", "state_code": 1 if down else 4,
                "phys_state": "Polling" if down else "LinkUp",
                "phys_state_code": 2 if down else 5,
                "rate_gbps": 200.0 if n % 50 == 0 and i == 3 else 400.0,
                "link_width": 4, "link_speed": "NDR", "counters": counters,
                "rates": rates, "rates_since": now - timedelta(seconds=10),
            })  # fmt: skip
    return rows


def node_name(n: int) -> str:
    return f"gpu-node-{n:05d}"


def gpu_id(n: int, i: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node_name(n)}/{i}')}"


def _chunks(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), CHUNK):
        yield rows[start : start + CHUNK]


def seed(
    db: Database, n_nodes: int, *, fatal_every: int, ports_per_node: int, now: datetime
) -> None:
    """Nodes, GPUs with their newest sample, Xid events, straggler ratios, slowness scores,
    network ports and host errors."""
    sample = _sample(1)
    with db.write() as conn:
        node_rows = [
            {
                "id": n + 1,
                "name": node_name(n),
                "labels": {"cluster": f"c{n // 4096}", "row": f"{n // 256}", "rack": f"r{n // 16}"},
                "interval_s": 10.0,
                "agent_version": "0.1.0",
                "boot_id": "boot-1",
                "first_seen": now - timedelta(days=200),
                "last_seen": now,
            }
            for n in range(n_nodes)
        ]
        for chunk in _chunks(node_rows):
            conn.execute(insert(nodes), chunk)
        gpu_rows = [
            {
                "uuid": gpu_id(n, i),
                "node_id": n + 1,
                "index": i,
                "serial": f"{n:06d}{i:02d}",
                "pci_bus_id": f"0000:{0x18 + i:02x}:00.0",
                "name": "NVIDIA H100 80GB HBM3",
                "driver_version": "550.90.07",
                "vbios_version": "96.00.74.00.01",
                "first_seen": now - timedelta(days=200),
                "last_seen": now,
                "latest_ts": now,
                "latest": sample,
            }
            for n in range(n_nodes)
            for i in range(GPUS_PER_NODE)
        ]
        for chunk in _chunks(gpu_rows):
            conn.execute(insert(gpus), chunk)
        event_rows = [
            {
                "node_id": n + 1,
                "gpu_uuid": gpu_id(n, 0),
                "kind": "xid",
                "xid": 13,
                "ts": now - timedelta(minutes=5),
                "received_at": now - timedelta(minutes=5),
            }
            for n in range(0, n_nodes, 10)
        ]
        event_rows += [
            {
                "node_id": g // GPUS_PER_NODE + 1,
                "gpu_uuid": gpu_id(g // GPUS_PER_NODE, g % GPUS_PER_NODE),
                "kind": "xid",
                "xid": 48,
                "ts": now - timedelta(minutes=5),
                "received_at": now - timedelta(minutes=5),
            }
            for g in range(0, n_nodes * GPUS_PER_NODE, fatal_every)
        ]
        host = [(n, "mce", "corrected") for n in range(0, n_nodes, 20)]
        host += [(n, "sxid", "fatal") for n in range(0, n_nodes, 500)]
        host_rows = [
            {
                "node_id": n + 1,
                "kind": kind,
                "details": {"severity": severity},
                "ts": now - timedelta(minutes=5),
                "received_at": now - timedelta(minutes=5),
            }
            for n, kind, severity in host
        ]
        for chunk in _chunks(event_rows):
            conn.execute(insert(events), chunk)
        conn.execute(insert(events), host_rows)
        for chunk in _chunks(port_rows(n_nodes, ports_per_node, now)):
            conn.execute(insert(node_ports), chunk)
        rng = np.random.default_rng(5)
        ratios = rng.lognormal(0.0, 0.05, n_nodes)
        job_rows = [
            {
                "job_id": f"train-{start // NODES_PER_JOB:04d}",
                "next_start": now,
                "detector": {},
                "ratios": {
                    node_name(n): round(float(ratios[n]), 4)
                    for n in range(start, min(start + NODES_PER_JOB, n_nodes))
                },
                "updated_at": now,
            }
            for start in range(0, n_nodes, NODES_PER_JOB)
        ]
        conn.execute(insert(straggler_state), job_rows)
        slowness_rows = [
            {"node": node_name(n), "score": float(ratios[n]), "windows": 30, "updated_at": now}
            for n in range(n_nodes)
        ]
        for chunk in _chunks(slowness_rows):
            conn.execute(insert(node_slowness), chunk)


def everyone_reports(db: Database, tick: int) -> None:
    """Every GPU and node reported a new sample (what 10 s of a fleet does to the two tables)."""
    now = datetime.now(UTC)
    with db.write() as conn:
        conn.execute(update(gpus).values(latest_ts=now, last_seen=now, latest=_sample(tick)))
        conn.execute(update(nodes).values(last_seen=now))


def store_risk_model(db: Database) -> None:
    """A model fitted on synthetic lifetimes (as the Prometheus integration test does)."""
    rng = np.random.default_rng(7)
    sbe = rng.exponential(5.0, 600)
    life = 400.0 * np.exp(-0.15 * sbe) * rng.weibull(1.4, 600)
    censor = rng.uniform(50, 600, 600)
    frame = pd.DataFrame(
        {
            "duration_days": np.minimum(life, censor),
            "event": (life <= censor).astype(int),
            "group": "NVIDIA H100 80GB HBM3",
            "sbe_per_day": sbe,
        }
    )
    with db.write() as conn:
        store_model(conn, RiskBundle.fit(frame), trigger="manual", trained_at=datetime.now(UTC))


@contextmanager
def database(postgres: str | None) -> Iterator[str]:
    """A fresh database URL: a SQLite file in a temporary directory, or a throwaway PostgreSQL
    database created on ``postgres`` and dropped at the end."""
    if postgres is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/metrics.db"
        return
    import psycopg

    base = make_url(ServerSettings(database_url=postgres).database_url)
    name = f"fleetwatch_bench_{secrets.token_hex(4)}"
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scrape(client: httpx.Client, params: dict[str, str], *, gzip: bool) -> tuple[float, bytes]:
    """(seconds until the last byte arrived, the body as sent)."""
    headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
    started = time.perf_counter()
    with client.stream("GET", "/metrics", params=params, headers=headers) as response:
        response.raise_for_status()
        body = b"".join(response.iter_raw())
    return time.perf_counter() - started, body


def family_bytes(text: str) -> Counter[str]:
    """Bytes of sample lines per metric family name (the name before ``{`` or the value)."""
    sizes: Counter[str] = Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sizes[line.split("{", 1)[0].split(" ", 1)[0]] += len(line) + 1
    return sizes


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def risk_render_cost(url: str) -> tuple[float, float]:
    """(wall s, CPU s) to render the default page's risk series for a new assessment of the
    fleet in ``url`` (scoring every GPU at every horizon), in this process."""
    from cryptography.fernet import Fernet
    from fastapi.testclient import TestClient

    from fleetwatch.server.app import create_app
    from fleetwatch.server.judge.assessment import FleetAssessment
    from fleetwatch.server.metrics.risk_exposition import render_risk

    settings = ServerSettings(
        database_url=url,
        background_jobs=False,
        insecure_no_auth=True,
        secret_keys=[Fernet.generate_key().decode()],
    )
    with TestClient(create_app(settings)) as client:
        snapshot = client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    # A copy nobody has scored yet (the app's own prefetch may have scored the original).
    fresh = FleetAssessment(snapshot.at, snapshot.gpus, snapshot.bundle, snapshot.model_version)
    wall, cpu = time.perf_counter(), time.thread_time()
    render_risk(fresh, settings.risk_horizons_h)
    return time.perf_counter() - wall, time.thread_time() - cpu


def wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not become ready")


def _print_page(title: str, body: bytes, gzipped: int, top: int = 12) -> None:
    text = body.decode()
    sizes = family_bytes(text)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"\n{title}: {len(body) / 1e6:.2f} MB, gzip {gzipped / 1e6:.2f} MB, {series} series")
    print("| family | MB |")
    print("|---|---:|")
    for name, size in sizes.most_common(top):
        print(f"| {name} | {size / 1e6:.3f} |")
    rest = sum(sizes.values()) - sum(s for _, s in sizes.most_common(top))
    if rest:
        print(f"| ({len(sizes) - top} other families) | {rest / 1e6:.3f} |")
    fabric = {k: v for k, v in sizes.items() if k.startswith(_FABRIC_PREFIXES)}
    print(
        f"fabric families (ports, host errors): {len(fabric)}, {sum(fabric.values())} bytes, "
        f"{sum(1 for line in text.splitlines() if line.startswith(_FABRIC_PREFIXES))} series"
    )


_FABRIC_PREFIXES = (
    "fleetwatch_port_",
    "fleetwatch_ports",
    "fleetwatch_node_ports_",
    "fleetwatch_host_events",
    "fleetwatch_fleet_host_events",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument(
        "--shards",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[16],
        help="shard counts to scrape shard --shard of, e.g. 16,32 [16]",
    )
    parser.add_argument("--shard", type=int, default=3)
    parser.add_argument(
        "--shard-scrapes", type=int, default=None, help="default: --scrapes; 0 for an old server"
    )
    parser.add_argument("--fatal-every", type=int, default=1000)
    parser.add_argument("--ports-per-node", type=int, default=GPUS_PER_NODE)
    parser.add_argument(
        "--no-risk-render",
        dest="risk_render",
        action="store_false",
        help="skip timing the risk series of a new assessment in-process",
    )
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_POSTGRES,
        default=None,
        help=f"use a throwaway database on this PostgreSQL server [{DEFAULT_POSTGRES}]",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.scrapes, args.shards, args.shard = 80, 1, [1], 0  # one shard: them all
    n_nodes = args.gpus // GPUS_PER_NODE
    shard_scrapes = args.scrapes if args.shard_scrapes is None else args.shard_scrapes
    shard_pages = {
        f"shard {args.shard}/{n}": {"shard": str(args.shard), "shards": str(n)} for n in args.shards
    }

    load_at_start = os.getloadavg()
    with database(args.postgres) as url:
        db = Database(make_engine(ServerSettings(database_url=url)))
        upgrade(db.engine)
        print(f"seeding {n_nodes} nodes x {GPUS_PER_NODE} GPUs ...", file=sys.stderr)
        started = time.perf_counter()
        seed(
            db,
            n_nodes,
            fatal_every=args.fatal_every,
            ports_per_node=args.ports_per_node,
            now=datetime.now(UTC),
        )
        store_risk_model(db)
        with db.write() as conn:
            token, _ = create_token(conn, name="bench", scope="read")
        print(f"seeded in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        port = 18000 + (int(time.time()) % 1000)
        env = {**os.environ, "FLEETWATCH_SERVER_BACKGROUND_JOBS": "false"}
        server = subprocess.Popen(
            [sys.executable, "-m", "fleetwatch", "server", "--port", str(port)]
            + ["--database-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        times: dict[str, list[float]] = {}
        cpu_times: dict[str, list[float]] = {}
        pages: dict[str, tuple[bytes, int]] = {}
        try:
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                timeout=600,
                headers={"Authorization": f"Bearer {token}"},
            )
            wait_ready(client)
            print("assessing the fleet (GET /v1/risk) ...", file=sys.stderr)
            started = time.perf_counter()
            client.get("/v1/risk", params={"limit": "1"}).raise_for_status()
            assessed_s = time.perf_counter() - started

            def timed(params: dict[str, str], *, gzip: bool) -> tuple[float, float, bytes]:
                """(wall s, server CPU s, body) of one scrape."""
                before = cpu_s(server.pid)
                wall, body = scrape(client, params, gzip=gzip)
                return wall, cpu_s(server.pid) - before, body

            def record(label: str, wall: float, cpu: float) -> None:
                times.setdefault(label, []).append(wall)
                cpu_times.setdefault(label, []).append(cpu)

            def measure(label: str, params: dict[str, str], n: int) -> None:
                wall, cpu, body = timed(params, gzip=False)
                record(f"{label}: first scrape", wall, cpu)
                for _ in range(n):
                    record(f"{label}: repeat", *timed(params, gzip=False)[:2])
                for _ in range(n):
                    wall, cpu, zipped = timed(params, gzip=True)
                    record(f"{label}: repeat, gzip", wall, cpu)
                pages[label] = (body, len(zipped))
                assert gzip_module.decompress(zipped)[:1] in (b"#", b"f")

            # Every node reported since the server started: node_up is 1, as in a live fleet.
            everyone_reports(db, 2)
            time.sleep(2.1)  # the cache TTL
            measure("default page", {}, args.scrapes)
            if shard_scrapes:
                for label, params in shard_pages.items():
                    measure(label, params, shard_scrapes)
            for tick in range(3, 3 + min(args.scrapes, 3)):
                print(f"every GPU reports anew (round {tick - 2}) ...", file=sys.stderr)
                everyone_reports(db, tick)
                time.sleep(2.1)  # the cache TTL
                record("default page: after every GPU reported anew", *timed({}, gzip=True)[:2])
                for label, params in shard_pages.items() if shard_scrapes else ():
                    record(
                        f"{label}: after every GPU reported anew, gzip",
                        *timed(params, gzip=True)[:2],
                    )
            client.close()
            rss = peak_rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait()
        print("rendering the risk series of a new assessment in-process ...", file=sys.stderr)
        risk_render = risk_render_cost(url) if args.risk_render else None
        db.dispose()

    backend = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"\n/metrics for {n_nodes * GPUS_PER_NODE} GPUs on {n_nodes} nodes ({backend}); "
        f"assessment on request {assessed_s:.1f} s; server peak RSS {rss:.0f} MB; "
        f"load average {', '.join(f'{x:.1f}' for x in load_at_start)} at start, "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end ({os.cpu_count()} CPUs)"
    )
    for label, (body, zipped) in pages.items():
        _print_page(label, body, zipped)
    print("\n| scrape | median s | max s | server CPU s (median) | n |")
    print("|---|---:|---:|---:|---:|")
    for name, values in times.items():
        cpu = statistics.median(cpu_times[name])
        print(
            f"| {name} | {statistics.median(values):.3f} | {max(values):.3f} | {cpu:.2f} "
            f"| {len(values)} |"
        )
    if risk_render is not None:
        print(
            f"\nrisk series of a new assessment (RiskPrefetch's work, in-process): "
            f"{risk_render[0]:.2f} s wall, {risk_render[1]:.2f} s CPU"
        )


if __name__ == "__main__":
    main()
