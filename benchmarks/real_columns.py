#!/usr/bin/env python
"""What reading ``real`` columns packed costs: PostgreSQL printing and re-reading each value, or
sending its four bytes and numpy turning them into the same float64.

The sample read hands the rules a real as the float64 of the decimal PostgreSQL prints for it.
The packed read of the row table asked PostgreSQL for ``real::text::float8`` at first, then for
``float4send``, turning the bytes with ``as_printed`` (``server/db/real_values.py``; the block
decoder, ``server/db/sample_blocks.py``, uses it on the stored float32s). This fills a temporary
table with ``--rows`` rows of nine real columns as a fleet reports them (eight whole numbers:
temperatures, clocks, percentages, the power limit; one in milliwatts: the power draw), then
times, ``--repeat`` times each, one ``string_agg`` over all nine columns both ways (wall time of
the query; the database does the work) and ``as_printed`` on the fetched bytes (this process's
CPU). Medians are printed.

Run: ``.venv/bin/python benchmarks/real_columns.py [--rows 300000] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import psycopg

from fleetwatch.server.db.real_values import as_printed

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
_COLUMNS = 9
_MILLIWATTS = 2  # the one column with fractions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default=DEFAULT_POSTGRES)
    args = parser.parse_args()
    with psycopg.connect(args.database_url) as conn:
        columns = ", ".join(f"c{j} real" for j in range(_COLUMNS))
        conn.execute(f"CREATE TEMP TABLE reals ({columns})")
        values = ", ".join(
            "round((random() * 700)::numeric, 3)" if j == _MILLIWATTS else "(random() * 2000)::int"
            for j in range(_COLUMNS)
        )
        conn.execute(f"INSERT INTO reals SELECT {values} FROM generate_series(1, %s)", [args.rows])
        conn.execute("ANALYZE reals")
        forms = {
            "printed by PostgreSQL (real::text::float8)": (
                "float8send(COALESCE(c{j}::text::float8, 0))"
            ),
            "sent as stored (float4send)": "float4send(COALESCE(c{j}, 0))",
        }
        print(f"{args.rows:,} rows x {_COLUMNS} real columns, median of {args.repeat}:")
        fetched: list[bytes] = []
        for name, form in forms.items():
            sql = (
                "SELECT "
                + ", ".join(f"string_agg({form.format(j=j)}, ''::bytea)" for j in range(_COLUMNS))
                + " FROM reals"
            )
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                fetched = list(conn.execute(sql).fetchone() or ())
                times.append(time.perf_counter() - started)
            print(f"- {name}: {1000 * statistics.median(times):,.0f} ms")
        cpu = []
        for _ in range(args.repeat):
            started = time.process_time()
            for column in fetched:
                as_printed(np.frombuffer(column, ">f4").astype(np.float32))
            cpu.append(time.process_time() - started)
        took = 1000 * statistics.median(cpu)
        print(f"- as_printed on the sent bytes, this process: {took:,.0f} ms CPU")


if __name__ == "__main__":
    main()
