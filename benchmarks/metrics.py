"""How long a Prometheus scrape of /metrics takes for a large fleet (default 10,000 GPUs).

Seeds N nodes x 8 GPUs (every canonical field) and some Xid events into a fresh SQLite file,
starts the real server on it, and times scrapes over loopback HTTP: the first one (cache cold),
repeats (nothing changed), and scrapes after every GPU reported a new sample (every line rebuilt).
Side by side, the same series rendered by prometheus_client's own exposition (a custom collector
yielding GaugeMetricFamily objects), which is what a straightforward implementation would do.

    .venv/bin/python benchmarks/metrics.py [--gpus 10000] [--scrapes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.repo.ingest import store_batch  # noqa: E402
from fleetwatch.telemetry import Batch  # noqa: E402

GPUS_PER_NODE = 8


def _sample(gpu_uuid: str, ts: datetime, tick: int) -> dict[str, Any]:
    return {
        "uuid": gpu_uuid,
        "ts": ts.isoformat(),
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


def seed(
    db: Database,
    nodes: int,
    tick: int,
    *,
    fatal_every: int = 0,
    offset: timedelta = timedelta(0),
) -> None:
    """One sample per GPU at ``now - 1 s + offset``; an application Xid on every 10th node and,
    with ``fatal_every``, a DBE Xid (48) on every ``fatal_every``-th GPU."""
    now = datetime.now(UTC) - timedelta(seconds=1) + offset
    for n in range(nodes):
        name = f"bench-{n:05d}"
        gpus = [
            {
                "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}/{i}')}",
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "serial": f"{n:06d}{i:02d}",
                "pci_bus_id": f"0000:{0x18 + i:02x}:00.0",
                "driver_version": "550.90.07",
            }
            for i in range(GPUS_PER_NODE)
        ]
        events = (
            [{"kind": "xid", "uuid": gpus[0]["uuid"], "xid": 13, "ts": now.isoformat()}]
            if n % 10 == 0
            else []
        )
        if fatal_every:
            events += [
                {"kind": "xid", "uuid": g["uuid"], "xid": 48, "ts": now.isoformat()}
                for i, g in enumerate(gpus)
                if (n * GPUS_PER_NODE + i) % fatal_every == 0
            ]
        batch = Batch.model_validate_json(
            json.dumps(
                {
                    "batch_id": str(uuid.uuid4()),
                    "node": {"name": name, "interval_s": 3600, "labels": {"rack": f"r{n // 16}"}},
                    "gpus": gpus,
                    "samples": [_sample(g["uuid"], now, tick) for g in gpus],
                    "events": events,
                }
            )
        )
        store_batch(db, batch, content_sha256=batch.batch_id, now=datetime.now(UTC))


def scrape(client: httpx.Client, gzip: bool) -> tuple[float, int]:
    headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
    started = time.perf_counter()
    with client.stream("GET", "/metrics", headers=headers) as response:
        response.raise_for_status()
        size = sum(len(chunk) for chunk in response.iter_raw())
    return time.perf_counter() - started, size


def prometheus_client_baseline(db: Database) -> tuple[float, int]:
    """The same GPU series through prometheus_client's collector protocol and generate_latest."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from sqlalchemy import select

    from fleetwatch.metrics import GPU_METRICS
    from fleetwatch.server.db.tables import gpus, nodes

    class Naive:
        def collect(self) -> Any:
            with db.read() as conn:
                rows = list(conn.execute(select(gpus, nodes.c.name.label("node")).join(nodes)))
            for metric in GPU_METRICS:
                family = GaugeMetricFamily(
                    metric.name.removesuffix("_total"),
                    metric.help,
                    labels=["node", "gpu", "uuid", "model"],
                )
                for row in rows:
                    value = (row.latest or {}).get(metric.field)
                    if value is not None:
                        family.add_metric(
                            [row.node, str(row.index), row.uuid, row.name or ""],
                            float(value) * metric.scale,
                        )
                yield family

    registry = CollectorRegistry()
    registry.register(Naive())
    started = time.perf_counter()
    payload = generate_latest(registry)
    return time.perf_counter() - started, len(payload)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=5)
    args = parser.parse_args()
    nodes = args.gpus // GPUS_PER_NODE

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/metrics.db"
        db = Database(make_engine(ServerSettings(database_url=url)))
        upgrade(db.engine)
        print(f"seeding {nodes} nodes x {GPUS_PER_NODE} GPUs ...", file=sys.stderr)
        seed(db, nodes, tick=1)
        from fleetwatch.server.auth import create_token

        with db.write() as conn:
            token, _ = create_token(conn, name="bench", scope="read")
        port = 18000 + (int(time.time()) % 1000)
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetwatch",
                "server",
                "--port",
                str(port),
                "--database-url",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        results: dict[str, list[float]] = {}
        sizes: dict[str, int] = {}
        try:
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                timeout=120,
                headers={"Authorization": f"Bearer {token}"},
            )
            for _ in range(100):
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            first, sizes["identity"] = scrape(client, gzip=False)
            results["first scrape (cache cold)"] = [first]
            results["repeat scrape, nothing changed"] = [
                scrape(client, gzip=False)[0] for _ in range(args.scrapes)
            ]
            gz = [scrape(client, gzip=True) for _ in range(args.scrapes)]
            results["repeat scrape, gzip"] = [t for t, _ in gz]
            sizes["gzip"] = gz[0][1]
            changed = []
            for tick in range(2, 2 + min(args.scrapes, 3)):
                print(f"every GPU reports a new sample (round {tick - 1}) ...", file=sys.stderr)
                seed(db, nodes, tick=tick)
                time.sleep(2.1)  # the cache TTL
                changed.append(scrape(client, gzip=False)[0])
            results["after every GPU reported anew"] = changed
            client.close()
        finally:
            server.terminate()
            server.wait()
        baseline, baseline_size = prometheus_client_baseline(db)
        results["prometheus_client generate_latest, same GPU series (in-process)"] = [baseline]
        db.dispose()

    print(
        f"\n/metrics for {nodes * GPUS_PER_NODE} GPUs on {nodes} nodes "
        f"(page {sizes['identity'] / 1e6:.1f} MB, gzip {sizes['gzip'] / 1e6:.1f} MB; "
        f"baseline page {baseline_size / 1e6:.1f} MB)\n"
    )
    print("| scrape | median s | max s | n |")
    print("|---|---:|---:|---:|")
    for name, times in results.items():
        print(f"| {name} | {statistics.median(times):.3f} | {max(times):.3f} | {len(times)} |")


if __name__ == "__main__":
    main()
