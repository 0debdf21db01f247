"""Disk bytes per GPU row (a sample: one GPU's fields at one tick): the 0006 schema's
``gpu_samples`` against today's ``gpu_sample_blocks``, on PostgreSQL, and Prometheus' TSDB on the
same values.

```
.venv/bin/python benchmarks/storage_size.py [--nodes 35] [--ticks 715] [--postgres URL]
                                            [--no-prometheus] [--json results.json]
```

The same rows for all three: ``SimNode`` of ``benchmarks/ingest.py`` (every one of the 34 fields,
realistic values, counters that only grow), ``nodes`` x 8 GPUs x ``ticks`` ticks 10 s apart
(35 x 8 x 715 = 200,200 rows, within one 2-hour window so that Prometheus writes one block).

- **0006**: a throwaway database at revision 0006 (one table, UUID and boot id strings, doubles),
  nodes and GPUs registered, the samples loaded with the 0006 writer's statement (text ``COPY
  gpu_samples (gpu_uuid, node_id, ts, boot_id, ...)``), 48 rows per transaction as a push of 6
  ticks makes.
- **head**: a throwaway database at head, every batch (8 GPUs x 6 ticks) through ``store_batch``,
  the server's own path: one compressed block per GPU per push (8 blocks of 6 ticks), binary COPY
  into ``gpu_sample_blocks``' day partition.
- **Prometheus**: the same values as OpenMetrics (one series per GPU and field, dcgm-exporter's
  metric names and labels), turned into a TSDB block by ``promtool tsdb create-blocks-from
  openmetrics``; bytes are the block directory (chunks, index, metadata).

PostgreSQL bytes are taken after ``VACUUM (ANALYZE)`` and ``CHECKPOINT``: the sum of
``pg_total_relation_size`` over every leaf partition (heap, TOAST, free-space and visibility
maps, every index), with the heap and each index also on their own, divided by the samples
stored (0006: its rows; head: the ticks of every block, ``sum(n)``).

With ``--blocks 60,360``, the same samples also go into a head database as blocks of that many
ticks per GPU (what a push of 10 minutes, or a compaction of an hour, would store), encoded with
the product's codec (``server/db/sample_blocks.py``; ``benchmarks/sample_blocks.py`` times it
and checks its round trip) and loaded by the server's binary COPY.

With ``--sqlite N``, the first N rows also go into SQLite files the same two ways (0006: the
0006 writer's ``executemany``; head: ``store_batch``), measured as ``dbstat`` pages of the
samples' table and its indexes; then a retention pass deletes them all, 5,000 rows (head: blocks)
per transaction, timing how long each transaction holds the writer lock (what an ingest may
wait).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.sample_blocks import encode_blocks  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.jobs.retention import RetentionJob  # noqa: E402
from fleetwatch.server.repo.ingest import store_batch  # noqa: E402
from fleetwatch.server.repo.sample_reader import from_us, to_us  # noqa: E402
from fleetwatch.server.repo.sample_writer import copy_blocks  # noqa: E402
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, SAMPLE_FIELDS, Batch  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_ingest", REPO / "benchmarks" / "ingest.py")
assert _spec is not None and _spec.loader is not None
bench_ingest = importlib.util.module_from_spec(_spec)
sys.modules["bench_ingest"] = bench_ingest
_spec.loader.exec_module(bench_ingest)
SimNode = bench_ingest.SimNode

GPUS_PER_NODE = 8
TICKS_PER_PUSH = 6
START = datetime(2026, 11, 30, 2, tzinfo=UTC)  # a 2-hour boundary: one Prometheus block
OLD_COLUMNS = ("gpu_uuid", "node_id", "ts", "boot_id", *SAMPLE_FIELD_NAMES)
# The samples' table of each schema, and how many samples a row of it holds.
TABLES = {"0006": ("gpu_samples", "count(*)"), "head": ("gpu_sample_blocks", "sum(n)")}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_batches(nodes: int, ticks: int, seed: int) -> list[dict[str, Any]]:
    """Every push of every node, in time order: what an agent pushing every minute sends."""
    rng = random.Random(seed)
    fleet = [SimNode(f"node-{n:04d}", GPUS_PER_NODE, START, rng) for n in range(nodes)]
    batches: list[dict[str, Any]] = []
    for first in range(0, ticks, TICKS_PER_PUSH):
        for node in fleet:
            batches.append(node.batch(min(TICKS_PER_PUSH, ticks - first)))
    return batches


class Throwaway:
    """A database of its own on the PostgreSQL server, dropped at the end."""

    def __init__(self, server_url: str, label: str) -> None:
        base = make_url(ServerSettings(database_url=server_url).database_url)
        self.name = f"fleetwatch_size_{label}_{secrets.token_hex(3)}"
        self.admin = base.set(drivername="postgresql", database="postgres").render_as_string(
            hide_password=False
        )
        with psycopg.connect(self.admin, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        target = base.set(database=self.name)
        self.url = target.render_as_string(hide_password=False)
        self.dsn = target.set(drivername="postgresql").render_as_string(hide_password=False)

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def load_0006(db: Database, batches: list[dict[str, Any]]) -> None:
    """The 0006 schema, filled as its writer did (text COPY, a transaction per push)."""
    upgrade(db.engine, "0006")
    raw = db.engine.raw_connection()
    try:
        conn = raw.driver_connection
        assert conn is not None
        node_ids: dict[str, int] = {}
        with conn.cursor() as cur:
            for batch in batches:
                name = batch["node"]["name"]
                if name not in node_ids:
                    cur.execute(
                        "INSERT INTO nodes (name, labels, interval_s, boot_id, first_seen, "
                        "last_seen) VALUES (%s, '{}', 10, %s, %s, %s) RETURNING id",
                        (name, batch["node"]["boot_id"], START, START),
                    )
                    row = cur.fetchone()
                    assert row is not None
                    node_ids[name] = int(row[0])
                    for gpu in batch["gpus"]:
                        cur.execute(
                            'INSERT INTO gpus (uuid, node_id, "index", first_seen, last_seen) '
                            "VALUES (%s, %s, %s, %s, %s)",
                            (gpu["uuid"], node_ids[name], gpu["index"], START, START),
                        )
            conn.commit()
            statement = f"COPY gpu_samples ({', '.join(OLD_COLUMNS)}) FROM STDIN"
            for batch in batches:
                node_id, boot = node_ids[batch["node"]["name"]], batch["node"]["boot_id"]
                with cur.copy(statement) as copy:
                    for s in batch["samples"]:
                        ts = datetime.fromisoformat(s["ts"])
                        copy.write_row(
                            (s["uuid"], node_id, ts, boot, *(s[n] for n in SAMPLE_FIELD_NAMES))
                        )
                conn.commit()
    finally:
        raw.close()


def load_head(db: Database, batches: list[dict[str, Any]]) -> None:
    """Today's schema, every batch through the server's store path, into the day partition the
    retention job creates (the clock set to the data's start)."""
    upgrade(db.engine)
    RetentionJob(db, raw_retention=timedelta(days=14), rollup_retention=timedelta(days=730))(START)
    for batch in batches:
        body = json.dumps(batch).encode()
        parsed = Batch.model_validate_json(body)
        now = max(s.ts for s in parsed.samples)
        store_batch(db, parsed, content_sha256=hashlib.sha256(body).hexdigest(), now=now)


def measure_postgres(dsn: str, rows_expected: int, schema: str) -> dict[str, Any]:
    """Bytes per sample of ``schema``'s samples table (a key of :data:`TABLES`)."""
    name, samples = TABLES[schema]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")
        rows = conn.execute(f"SELECT {samples}, count(*) FROM {name}").fetchone()
        assert rows is not None and rows[0] == rows_expected, (rows, rows_expected)
        stored_rows = int(rows[1])
        leaves = [
            r[0]
            for r in conn.execute(
                "SELECT relid::regclass::text FROM pg_partition_tree(%s) WHERE isleaf", (name,)
            ).fetchall()
        ] or [name]  # 0006: not partitioned
        total = heap = 0
        indexes: dict[str, int] = {}
        for leaf in leaves:
            one = conn.execute(
                "SELECT pg_total_relation_size(%s::regclass), pg_table_size(%s::regclass)",
                (leaf, leaf),
            ).fetchone()
            assert one is not None
            total += int(one[0])
            heap += int(one[1])
            for index, size in conn.execute(
                "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) "
                "FROM pg_index i WHERE i.indrelid = %s::regclass",
                (leaf,),
            ).fetchall():
                # Name the partitioned index, not each partition's copy of it.
                parent = conn.execute(
                    "SELECT inhparent::regclass::text FROM pg_inherits "
                    "WHERE inhrelid = %s::regclass",
                    (index,),
                ).fetchone()
                key = parent[0] if parent else index
                indexes[key] = indexes.get(key, 0) + int(size)
        if f"{name}_default" in leaves:
            left = conn.execute(f"SELECT count(*) FROM {name}_default").fetchone()
            assert left is not None and left[0] == 0, "rows outside their day partition"
        width = conn.execute(f"SELECT sum(pg_column_size(s.*)) FROM {name} s").fetchone()
        assert width is not None
        version = conn.execute("SHOW server_version").fetchone()
        assert version is not None
    n = rows_expected
    return {
        "rows": n,
        "table": name,
        "table_rows": stored_rows,  # head: blocks
        "partitions": len(leaves),
        "bytes": total,
        "bytes_per_row": round(total / n, 1),
        "heap_bytes_per_row": round(heap / n, 1),
        "row_data_bytes": round(float(width[0]) / n, 1),  # per sample
        "index_bytes_per_row": {k: round(v / n, 1) for k, v in sorted(indexes.items())},
        "server": f"PostgreSQL {version[0]}",
    }


_DCGM_LABELS = (
    'gpu="{index}",UUID="{uuid}",device="nvidia{index}",modelName="{model}",Hostname="{host}"'
)


def write_openmetrics(batches: list[dict[str, Any]], path: Path) -> int:
    """The same values as dcgm-exporter would expose them, one series per GPU and field (one
    pass over the samples per metric: OpenMetrics groups a metric's lines together)."""
    labels: dict[str, str] = {}
    for batch in batches:
        for gpu in batch["gpus"]:
            labels[gpu["uuid"]] = _DCGM_LABELS.format(
                index=gpu["index"], uuid=gpu["uuid"], model=gpu["name"], host=batch["node"]["name"]
            )
    samples = 0
    with path.open("w") as out:
        for spec in SAMPLE_FIELDS:
            metric = spec.dcgm or f"FLEETWATCH_{spec.name.upper()}"
            out.write(f"# TYPE {metric} gauge\n")
            for batch in batches:
                for s in batch["samples"]:
                    value = s.get(spec.name)
                    if value is not None:
                        ts = datetime.fromisoformat(s["ts"]).timestamp()
                        out.write(f"{metric}{{{labels[s['uuid']]}}} {float(value)!r} {ts:.3f}\n")
                        samples += 1
        out.write("# EOF\n")
    return samples


class TimedWrites(Database):
    """A database that records how long each write transaction held the writer lock."""

    holds: list[float]

    @contextmanager
    def write(self) -> Iterator[Connection]:
        started = time.perf_counter()
        try:
            with super().write() as conn:
                yield conn
        finally:
            self.holds.append(time.perf_counter() - started)


def load_0006_sqlite(db: Database, batches: list[dict[str, Any]]) -> None:
    """The 0006 schema on SQLite, filled as its writer did (executemany, a transaction a push)."""
    upgrade(db.engine, "0006")
    names = sorted({b["node"]["name"] for b in batches})
    with db.write() as conn:
        for node_id, name in enumerate(names, start=1):
            conn.execute(
                text(
                    "INSERT INTO nodes (id, name, labels, interval_s, first_seen, last_seen) "
                    "VALUES (:id, :name, '{}', 10, :t, :t)"
                ),
                {"id": node_id, "name": name, "t": START.replace(tzinfo=None)},
            )
    insert = text(
        f"INSERT INTO gpu_samples ({', '.join(OLD_COLUMNS)}) "
        f"VALUES ({', '.join(':' + c for c in OLD_COLUMNS)})"
    )
    for batch in batches:
        node_id, boot = names.index(batch["node"]["name"]) + 1, batch["node"]["boot_id"]
        rows = [
            {**{n: s[n] for n in SAMPLE_FIELD_NAMES}, "gpu_uuid": s["uuid"], "node_id": node_id,
             "boot_id": boot, "ts": datetime.fromisoformat(s["ts"]).replace(tzinfo=None)}
            for s in batch["samples"]
        ]  # fmt: skip
        with db.write() as conn:
            conn.execute(insert, rows)


def measure_sqlite(
    path: Path, label: str, batches: list[dict[str, Any]], rows: int
) -> dict[str, Any]:
    db = TimedWrites(make_engine(ServerSettings(database_url=f"sqlite:///{path}")))
    db.holds = []
    try:
        if label == "0006":
            load_0006_sqlite(db, batches)
        else:
            load_head(db, batches)
        name, samples = TABLES[label]
        with db.read() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            counted, stored_rows = conn.execute(
                text(f"SELECT {samples}, count(*) FROM {name}")
            ).one()
            assert counted == rows, (counted, rows)
            stored = conn.execute(
                text(
                    "SELECT sum(pgsize) FROM dbstat WHERE name = :t OR name IN "
                    "(SELECT name FROM sqlite_master WHERE tbl_name = :t)"
                ),
                {"t": name},
            ).scalar_one()
        out: dict[str, Any] = {
            "rows": rows,
            "table_rows": stored_rows,
            "bytes_per_row": round(int(stored) / rows, 1),
        }
        if label == "head":
            db.holds.clear()
            job = RetentionJob(
                db, raw_retention=timedelta(days=14), rollup_retention=timedelta(days=730)
            )
            done = job(START + timedelta(days=30))
            # samples_deleted counts blocks
            assert done is not None and done.samples_deleted == stored_rows, (done, stored_rows)
            chunks = sorted(db.holds)
            out["retention_transactions"] = len(chunks)
            out["retention_hold_ms_median"] = round(1000 * chunks[len(chunks) // 2], 1)
            out["retention_hold_ms_max"] = round(1000 * chunks[-1], 1)
        return out
    finally:
        db.dispose()


def measure_blocks(server_url: str, batches: list[dict[str, Any]], ticks: int) -> dict[str, Any]:
    """The samples as blocks of ``ticks`` ticks per GPU (the product's codec), loaded into a head
    database by the server's binary COPY; bytes per GPU row as for ``head``."""
    names = sorted({b["node"]["name"] for b in batches})
    keys: dict[str, int] = {}
    windows: dict[int, tuple[list[int], list[int], list[tuple[Any, ...]], list[int]]] = {}
    span_us = round(bench_ingest.INTERVAL_S * 1e6) * ticks
    for batch in batches:
        node_id = names.index(batch["node"]["name"]) + 1
        for s in batch["samples"]:
            ts = to_us(datetime.fromisoformat(s["ts"]))
            window = windows.setdefault((ts - to_us(START)) // span_us, ([], [], [], []))
            window[0].append(keys.setdefault(s["uuid"], len(keys) + 1))
            window[1].append(ts)
            window[2].append(tuple(s[n] for n in SAMPLE_FIELD_NAMES))
            window[3].append(node_id)
    blocks: list[tuple[Any, ...]] = []
    for gpu_keys, times, rows, node_ids in windows.values():
        node_of = dict(zip(gpu_keys, node_ids, strict=True))
        blocks += [
            (b.gpu_key, node_of[b.gpu_key], None, from_us(b.ts0_us), from_us(b.ts1_us), b.n, b.data)
            for b in encode_blocks(gpu_keys, times, rows)
        ]
    samples = sum(len(b["samples"]) for b in batches)
    target = Throwaway(server_url, f"blocks{ticks}")
    db = Database(make_engine(ServerSettings(database_url=target.url)))
    try:
        upgrade(db.engine)
        RetentionJob(db, raw_retention=timedelta(days=14), rollup_retention=timedelta(days=730))(
            START
        )
        with db.write() as conn:
            copy_blocks(conn, blocks)
        out = measure_postgres(target.dsn, samples, "head")
    finally:
        db.dispose()
        target.drop()
    return {
        "ticks_per_block": ticks,
        "blocks": len(blocks),
        **out,
        "compressed_data_bytes_per_row": round(sum(len(b[6]) for b in blocks) / samples, 1),
    }


def measure_prometheus(batches: list[dict[str, Any]], rows: int) -> dict[str, Any] | None:
    promtool = shutil.which("promtool")
    if promtool is None:
        log("promtool not found (Debian package prometheus): Prometheus skipped")
        return None
    with tempfile.TemporaryDirectory(prefix="fw-tsdb-") as tmp:
        source, blocks = Path(tmp) / "samples.om", Path(tmp) / "blocks"
        samples = write_openmetrics(batches, source)
        log(f"openmetrics: {samples:,} samples, {source.stat().st_size / 1e6:.0f} MB; promtool")
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(blocks)],
            check=True,
        )
        files = [p for p in blocks.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        chunks = sum(p.stat().st_size for p in files if p.parent.name == "chunks")
        version = subprocess.run([promtool, "--version"], capture_output=True, text=True).stdout
    return {
        "rows": rows,
        "samples": samples,
        "blocks": len({p.parent for p in files if p.name == "meta.json"}),
        "bytes": total,
        "bytes_per_row": round(total / rows, 1),
        "bytes_per_sample": round(total / samples, 2),
        "chunk_bytes_per_row": round(chunks / rows, 1),
        "server": version.splitlines()[0] if version else "promtool",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=35)
    parser.add_argument("--ticks", type=int, default=715)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-prometheus", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--blocks", default="", help="ticks per block, e.g. 60,360")
    parser.add_argument("--sqlite", type=int, default=0, help="rows for the SQLite part (0: none)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    batches = make_batches(args.nodes, args.ticks, args.seed)
    rows = sum(len(b["samples"]) for b in batches)
    log(f"{rows:,} GPU rows in {len(batches):,} batches of up to {TICKS_PER_PUSH} ticks")
    results: dict[str, Any] = {"rows": rows, "fields": len(SAMPLE_FIELDS)}
    for label, load in () if args.no_postgres else (("0006", load_0006), ("head", load_head)):
        target = Throwaway(args.postgres, label.replace(".", ""))
        db = Database(make_engine(ServerSettings(database_url=target.url)))
        try:
            started = time.perf_counter()
            load(db, batches)
            log(f"{label}: loaded in {time.perf_counter() - started:.0f} s")
            results[label] = measure_postgres(target.dsn, rows, label)
            log(f"{label}: {results[label]}")
        finally:
            db.dispose()
            target.drop()
    for ticks in [int(t) for t in args.blocks.split(",") if t]:
        results[f"blocks_{ticks}"] = measure_blocks(args.postgres, batches, ticks)
        log(f"blocks of {ticks} ticks: {results[f'blocks_{ticks}']}")
    if args.sqlite:
        part: list[dict[str, Any]] = []
        for batch in batches:
            if sum(len(b["samples"]) for b in part) >= args.sqlite:
                break
            part.append(batch)
        part_rows = sum(len(b["samples"]) for b in part)
        with tempfile.TemporaryDirectory(prefix="fw-size-") as tmp:
            for label in ("0006", "head"):
                started = time.perf_counter()
                results[f"sqlite_{label}"] = measure_sqlite(
                    Path(tmp) / f"{label}.db", label, part, part_rows
                )
                log(f"sqlite {label}: {results[f'sqlite_{label}']} "
                    f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    if not args.no_prometheus:
        results["prometheus"] = measure_prometheus(batches, rows)
        log(f"prometheus: {results['prometheus']}")

    print(f"{'store':<12} {'bytes/GPU row':>14} {'heap':>8} {'indexes':>8}  detail")
    for label in [k for k in ("0006", "head") if k in results]:
        r = results[label]
        index = sum(r["index_bytes_per_row"].values())
        detail = ", ".join(f"{k} {v}" for k, v in r["index_bytes_per_row"].items())
        print(f"{label:<12} {r['bytes_per_row']:>14} {r['heap_bytes_per_row']:>8} {index:>8.1f}  "
              f"row data {r['row_data_bytes']} B; {detail}")  # fmt: skip
    prom = results.get("prometheus")
    if prom:
        per_sample, chunks = prom["bytes_per_sample"], prom["chunk_bytes_per_row"]
        print(f"{'prometheus':<12} {prom['bytes_per_row']:>14} {'':>8} {'':>8}  "
              f"{per_sample} B/sample, chunks {chunks} B/row")  # fmt: skip
    for key in [k for k in results if k.startswith("blocks_")]:
        r = results[key]
        index = sum(r["index_bytes_per_row"].values())
        print(f"{key:<12} {r['bytes_per_row']:>14} {r['heap_bytes_per_row']:>8} {index:>8.1f}  "
              f"{r['blocks']:,} blocks; compressed data {r['compressed_data_bytes_per_row']} "
              "B/row")  # fmt: skip
    for label in ("0006", "head"):
        if f"sqlite_{label}" in results:
            r = results[f"sqlite_{label}"]
            print(f"{'sqlite ' + label:<12} {r['bytes_per_row']:>14}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
