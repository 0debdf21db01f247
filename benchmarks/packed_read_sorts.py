#!/usr/bin/env python
"""The packed sample read at PostgreSQL's default memory per sort and at the read's own.

The assessment and the rollups read new samples as packed arrays
(``server/judge/packed_samples.py``); the query sorts the rows by time, then by chunk. This fills
a throwaway database with ``--rows`` samples (30 s of a 100,000-GPU fleet: 300,000) of
``--gpus`` GPUs, then runs the judge's read under ``EXPLAIN ANALYZE`` at each ``work_mem`` in
turn, ``--repeat`` times, and prints each sort's method and the execution time. The product sets
``_WORK_MEM`` for the read's transaction.

Run: ``.venv/bin/python benchmarks/packed_read_sorts.py [--rows 300000] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics

import psycopg
from serverproc import ThrowawayDatabase, fleetwatch_cli

from fleetwatch.rules.health_screen import JUDGED_FIELDS
from fleetwatch.server.db.tables import gpu_samples
from fleetwatch.server.judge.packed_samples import _WORK_MEM, _query

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
_KEYS = ("id", "ts", "gpu_id", "node_id", "boot")


def fill(dsn: str, rows: int, gpus: int) -> None:
    fields = [c for c in gpu_samples.columns if c.name not in _KEYS]
    names = ", ".join(f'"{c.name}"' for c in fields)
    values = ", ".join(
        "false" if str(c.type) == "BOOLEAN" else "(random() * 100)::int" for c in fields
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nodes (name, labels, interval_s, first_seen, last_seen) "
            "SELECT 'node-' || i, '{}'::jsonb, 10, now(), now() FROM generate_series(1, %s) i",
            (max(1, gpus // 8),),
        )
        conn.execute(
            'INSERT INTO gpus (uuid, node_id, "index", first_seen, last_seen) '
            "SELECT 'GPU-' || i, 1 + i / 8 %% %s, i %% 8, now(), now() "
            "FROM generate_series(0, %s - 1) i",
            (max(1, gpus // 8), gpus),
        )
        conn.execute(
            f"INSERT INTO gpu_samples (ts, gpu_id, node_id, {names}) "
            f"SELECT now() - (g %% 30000) * interval '1 ms', 1 + g %% %s, 1, {values} "
            "FROM generate_series(1, %s) g",
            (gpus, rows),
        )
        conn.execute("ANALYZE")


def explain(dsn: str, work_mem: str) -> tuple[list[str], float]:
    sql, _ = _query(JUDGED_FIELDS, "s.id > %(after_id)s")
    params = {"chunk": 100_000, "until": "2100-01-01", "since": None, "after_id": 0}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET work_mem = '{work_mem}'")
        plan = [row[0] for row in conn.execute("EXPLAIN (ANALYZE) " + sql, params)]
    methods = [line.strip() for line in plan if "Sort Method" in line]
    ms = float(plan[-1].split(":")[1].split()[0])
    return methods, ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--database-url", default=os.environ.get("FLEETWATCH_BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    )
    args = parser.parse_args()
    db = ThrowawayDatabase(args.database_url)
    try:
        fleetwatch_cli("db", "upgrade", "--database-url", db.url)
        print(f"filling {args.rows:,} samples of {args.gpus:,} GPUs", flush=True)
        fill(db.dsn, args.rows, args.gpus)
        times: dict[str, list[float]] = {}
        for k in range(args.repeat):
            for work_mem in ("4MB", _WORK_MEM):  # PostgreSQL's default, then the read's own
                methods, ms = explain(db.dsn, work_mem)
                times.setdefault(work_mem, []).append(ms)
                print(f"round {k + 1}: work_mem {work_mem}: {ms:.0f} ms; {methods}", flush=True)
        for work_mem, values in times.items():
            print(f"work_mem {work_mem}: median {statistics.median(values):.0f} ms")
    finally:
        db.drop()


if __name__ == "__main__":
    main()
