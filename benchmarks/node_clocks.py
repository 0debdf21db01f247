#!/usr/bin/env python
"""What reading every node's clock costs the worker's interpreter, per read, at fleet scale.

The planner and the alerts each read every node's clock once a pass (every 10 s), and the alerts
read each node's ``cluster`` label. This fills a throwaway PostgreSQL database's ``nodes`` with
``--nodes`` rows (labels as agents send them) and times, in this process's CPU, side by side:

- **typed rows**: the clocks through SQLAlchemy's rows and type processing (``node_clocks``
  before);
- **node_clocks**: the product's read, straight from psycopg's binary cursor;
- **labels, parsed**: every node's name, labels (JSON), ``last_seen`` and interval (the alerts'
  second read before);
- **cluster only**: the name and ``labels->>'cluster'`` (the alerts' read now).

Run: ``.venv/bin/python benchmarks/node_clocks.py [--nodes 12500] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, select, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import make_engine
from fleetwatch.server.db.tables import nodes
from fleetwatch.server.judge.silence import NodeClock, node_clocks

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _fill(url: str, count: int) -> None:
    engine = make_engine(ServerSettings(database_url=url))
    nodes.create(engine)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (name, labels, interval_s, first_seen, last_seen, lag_s) "
                "SELECT 'node-' || k, jsonb_build_object('cluster', 'c' || (k % 4), "
                "'rack', 'r' || (k / 32), 'row', 'w' || (k / 512)), 10.0, now(), "
                "now() - (k % 60) * interval '1 second', 0.5 FROM generate_series(1, :n) k"
            ),
            {"n": count},
        )
    engine.dispose()


def _cpu_s(read: Callable[[], Any]) -> float:
    began = time.process_time()
    read()
    return time.process_time() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeat = 50, 1
    name = f"fw_node_clocks_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = args.admin_url.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(ServerSettings(database_url=url))
    try:
        _fill(url, args.nodes)
        cluster = nodes.c.labels["cluster"].as_string().label("cluster")
        reads: dict[str, Callable[[Any], Any]] = {
            "typed rows": lambda conn: [
                NodeClock(r.name, r.last_seen, r.interval_s, r.lag_s)
                for r in conn.execute(
                    select(nodes.c.name, nodes.c.last_seen, nodes.c.interval_s, nodes.c.lag_s)
                )
            ],
            "node_clocks": node_clocks,
            "labels, parsed": lambda conn: conn.execute(
                select(nodes.c.name, nodes.c.labels, nodes.c.last_seen, nodes.c.interval_s)
            ).all(),
            "cluster only": lambda conn: {
                r.name: r.cluster for r in conn.execute(select(nodes.c.name, cluster))
            },
        }
        times: dict[str, list[float]] = {key: [] for key in reads}
        with engine.connect() as conn:
            for _ in range(args.repeat):
                for key, read in reads.items():
                    times[key].append(_cpu_s(lambda read=read: read(conn)))  # type: ignore[misc]
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
    machine = platform.processor() or platform.machine()
    print(f"{args.nodes:,} nodes, PostgreSQL, {machine}, Python {platform.python_version()}; "
          f"CPU ms per read of this process, median of {args.repeat}:")  # fmt: skip
    for key, values in times.items():
        print(f"  {key:15} {1000 * statistics.median(values):7.1f}")


if __name__ == "__main__":
    main()
