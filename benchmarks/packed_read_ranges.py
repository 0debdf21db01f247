#!/usr/bin/env python
"""The rollups' read of new samples: one query over all of them, or one per range of ids.

A rollups pass folds the samples stored since its last pass (every 5 minutes: 3 million rows at
100,000 GPUs) read packed (``server/judge/packed_samples.py``). One query sorted all of them at
once, spilling to disk, and joined every row to ``gpus``; the read now goes a range of 100,000
ids at a time, without the join, and sorts each range by time in numpy. This fills a
throwaway database with ``--rows`` samples of ``--gpus`` GPUs (as ``packed_read_sorts.py``
does), then reads them all with the rollups' fields both ways, ``--repeat`` times each, and
prints the wall time, the PostgreSQL backend's CPU and this process's CPU (medians).

Run: ``.venv/bin/python benchmarks/packed_read_ranges.py [--rows 3000000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from packed_read_sorts import DEFAULT_POSTGRES, fill
from procstats import proc_cpu_s
from serverproc import ThrowawayDatabase, fleetwatch_cli
from sqlalchemy import Connection, create_engine, text

from fleetwatch.server.jobs.rollups import _PACKED
from fleetwatch.server.judge.packed_samples import _WORK_MEM, _query, _unpacked, packed_samples

_FAR = datetime(9999, 1, 1, tzinfo=UTC)


def one_query(conn: Connection) -> int:
    """The read as it was: every row in one query, in chunks of 100,000 by time."""
    sql, dtypes = _query(_PACKED, "s.id > %(after_id)s")
    raw = conn.connection.driver_connection
    assert raw is not None
    raw.execute(f"SET LOCAL work_mem = '{_WORK_MEM}'")
    rows = 0
    with raw.cursor("old_read", binary=True) as cursor:
        cursor.itersize = 1
        cursor.execute(sql, {"chunk": 100_000, "until": _FAR, "after_id": 0})
        while (row := cursor.fetchone()) is not None:
            rows += _unpacked(row, dtypes).ids.size
    return rows


def by_ranges(conn: Connection) -> int:
    return sum(c.ids.size for c in packed_samples(conn, _PACKED, until=_FAR, after_id=0))


def measure(url: str, read: Callable[[Connection], int]) -> tuple[float, float, float, int]:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            pg_before, cpu_before = proc_cpu_s(backend), time.process_time()
            started = time.perf_counter()
            rows = read(conn)
            wall = time.perf_counter() - started
            pg, cpu = proc_cpu_s(backend) - pg_before, time.process_time() - cpu_before
    finally:
        engine.dispose()
    return wall, pg, cpu, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--database-url", default=os.environ.get("FLEETWATCH_BENCH_POSTGRES_URL", DEFAULT_POSTGRES)
    )
    args = parser.parse_args()
    db = ThrowawayDatabase(args.database_url)
    try:
        fleetwatch_cli("db", "upgrade", "--database-url", db.url)
        print(f"filling {args.rows:,} samples of {args.gpus:,} GPUs", flush=True)
        fill(db.dsn, args.rows, args.gpus)
        url = db.url.replace("postgresql://", "postgresql+psycopg://", 1)
        results: dict[str, list[tuple[float, float, float, int]]] = {}
        for k in range(args.repeat):
            for name, read in (("one query", one_query), ("ranges of 100,000 ids", by_ranges)):
                wall, pg, cpu, rows = measure(url, read)
                results.setdefault(name, []).append((wall, pg, cpu, rows))
                print(
                    f"round {k + 1}, {name}: {rows:,} rows, {wall:.2f} s wall, "
                    f"PostgreSQL {pg:.2f} CPU s, this process {cpu:.2f} CPU s",
                    flush=True,
                )
        for name, runs in results.items():
            wall, pg, cpu = (statistics.median(r[i] for r in runs) for i in range(3))
            print(f"{name}: median {wall:.2f} s wall, PostgreSQL {pg:.2f} CPU s, "
                  f"this process {cpu:.2f} CPU s")  # fmt: skip
    finally:
        db.drop()


if __name__ == "__main__":
    main()
