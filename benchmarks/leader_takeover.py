"""How long the write jobs go without a leader when the leader is killed with ``kill -9``.

Starts ``--processes`` real ``fleetwatch server --role worker`` processes on one throwaway
PostgreSQL database, then, for each trial: finds the leader (``fleetwatch_leader 1`` on
/metrics), kills it with SIGKILL, and measures the time until another process reports itself
leader; a fresh worker replaces the killed one before the next trial. Standbys retry the lock
every second, so the takeover is about one retry plus the time PostgreSQL takes to notice the
dead connection.

    .venv/bin/python benchmarks/leader_takeover.py [--trials 20] [--processes 3] [--smoke]

``--smoke`` (the test suite's): one takeover between two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
from sqlalchemy import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.live import LiveServer, fleetwatch, live_server  # noqa: E402

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def is_leader(server: LiveServer) -> bool:
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=2).text
    except httpx.TransportError:
        return False
    return any(
        line.startswith("fleetwatch_leader{") and line.endswith(" 1.0")
        for line in text.splitlines()
    )


def leaders(servers: list[LiveServer]) -> list[LiveServer]:
    return [s for s in servers if s.process.poll() is None and is_leader(s)]


def wait_for_one_leader(servers: list[LiveServer], timeout: float = 120.0) -> LiveServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = leaders(servers)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise SystemExit(f"{len(found)} leaders at once: {[s.url for s in found]}")
        time.sleep(0.01)
    raise SystemExit(f"no leader after {timeout} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--processes", type=int, default=3, choices=(2, 3, 4))
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES", DEFAULT_POSTGRES))
    parser.add_argument("--smoke", action="store_true", help="one takeover, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.processes = 1, 2

    admin_url = make_url(args.postgres).set(drivername="postgresql")
    name = f"fw_takeover_{uuid.uuid4().hex[:8]}"
    admin_dsn = admin_url.render_as_string(hide_password=False)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.set(database=name, drivername="postgresql+psycopg")
    database_url = url.render_as_string(hide_password=False)
    env = {
        "FLEETWATCH_SERVER_METRICS_REQUIRE_TOKEN": "false",
        "FLEETWATCH_SERVER_REFIT_INTERVAL_S": "0",
        "FLEETWATCH_SERVER_ASSESS_INTERVAL_S": "2",
        "FLEETWATCH_SERVER_PLANNER_INTERVAL_S": "2",
    }
    os.environ.update(env)
    takeovers: list[float] = []
    try:
        fleetwatch("db", "upgrade", "--database-url", database_url)
        with ExitStack() as stack, tempfile.TemporaryDirectory() as logs:

            def start() -> LiveServer:
                return stack.enter_context(
                    live_server(database_url, Path(logs), "--role", "worker")
                )

            servers = [start() for _ in range(args.processes)]
            for trial in range(args.trials):
                leader = wait_for_one_leader(servers)
                leader.process.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                leader.process.wait(timeout=30)
                servers.remove(leader)
                successor = wait_for_one_leader(servers)
                takeovers.append(time.monotonic() - killed)
                print(f"trial {trial + 1}: {takeovers[-1]:.3f} s ({successor.url} leads)")
                if trial + 1 < args.trials:
                    servers.append(start())  # back to --processes for the next trial
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    summary = {
        "trials": len(takeovers),
        "processes": args.processes,
        "p50_s": round(statistics.median(takeovers), 3),
        "p99_s": round(percentile(takeovers, 0.99), 3),
        "max_s": round(max(takeovers), 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
