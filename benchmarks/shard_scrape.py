"""One /metrics shard, scraped again and again, against a seeded fleet-scale database.

Seeds a throwaway PostgreSQL database as ``benchmarks/metrics.py`` does (every node and GPU with
its newest sample, node labels, Xids, straggler ratios, a fitted risk model; no network ports
unless ``--ports-per-node``), starts the real ``fleetwatch server`` on it with its background jobs
off, asks for the risk once (the assessment), then times ``--scrapes`` scrapes of shard
``--shard`` of ``--shards`` over loopback HTTP, uncompressed. With ``--profile FILE`` py-spy
(``pip install py-spy``) samples the server during the timed scrapes, the thread holding the
interpreter only, and writes collapsed stacks to FILE: where a shard's CPU goes.

    .venv/bin/python benchmarks/shard_scrape.py [--gpus 100000] [--shards 32] [--scrapes 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

import httpx
from metrics import (
    DEFAULT_POSTGRES,
    GPUS_PER_NODE,
    database,
    seed,
    store_risk_model,
    wait_ready,
)

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=15)
    parser.add_argument("--ports-per-node", type=int, default=0)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES)
    parser.add_argument("--port", type=int, default=18500)
    parser.add_argument("--profile", default=None, help="py-spy's collapsed stacks to this file")
    args = parser.parse_args()
    with database(args.postgres) as url:
        db = Database(make_engine(ServerSettings(database_url=url)))
        upgrade(db.engine)
        print(f"seeding {args.gpus} GPUs ...", file=sys.stderr)
        seed(
            db,
            args.gpus // GPUS_PER_NODE,
            fatal_every=1000,
            ports_per_node=args.ports_per_node,
            now=datetime.now(UTC),
        )
        store_risk_model(db)
        with db.write() as conn:
            token, _ = create_token(conn, name="bench", scope="read")
        db.dispose()
        env = {**os.environ, "FLEETWATCH_SERVER_BACKGROUND_JOBS": "false"}
        command = [sys.executable, "-m", "fleetwatch", "server", "--port", str(args.port)]
        server = subprocess.Popen(
            [*command, "--database-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            _time_scrapes(args, server.pid, token)
        finally:
            server.terminate()
            server.wait(60)


def _time_scrapes(args: argparse.Namespace, pid: int, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
    client = httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=600, headers=headers)
    wait_ready(client)
    client.get("/v1/risk", params={"limit": "1"}).raise_for_status()
    params = {"shard": str(args.shard), "shards": str(args.shards)}
    client.get("/metrics", params=params).raise_for_status()  # the first: caches warmed
    profiler = None
    if args.profile:
        spy = [sys.executable.replace("python", "py-spy"), "record", "--pid", str(pid)]
        profiler = subprocess.Popen(
            [*spy, "--rate", "250", "--gil", "--format", "raw", "-o", args.profile],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)
    seconds, size = [], 0
    for i in range(args.scrapes):
        started = time.perf_counter()
        answer = client.get("/metrics", params=params)
        answer.raise_for_status()
        seconds.append(time.perf_counter() - started)
        size = len(answer.content)
        print(f"scrape {i + 1}/{args.scrapes}: {seconds[-1]:.3f} s", file=sys.stderr)
    if profiler is not None:
        profiler.send_signal(2)
        profiler.wait(60)
    print(
        f"shard {args.shard} of {args.shards}, {args.gpus:,} GPUs: {size / 1e6:.2f} MB; "
        f"{len(seconds)} scrapes: median {statistics.median(seconds):.3f} s, "
        f"min {min(seconds):.3f} s, max {max(seconds):.3f} s"
    )


if __name__ == "__main__":
    main()
