"""Background work at fleet scale (default 100,000 GPUs): every pass the leader runs, timed.

Seeds a PostgreSQL database once (a template, reused while its parameters match) with
``--nodes`` nodes x 8 GPUs and a live fleet's recent history:

* ``--minutes`` of samples every 10 s (default 15: the health rules' history), all 34 fields;
  the first tick through the server's own ``store_batch`` (which registers the nodes, GPUs and
  boots), the others as pushes of 6 ticks, one block per GPU per push encoded with the server's
  codec and loaded by its binary COPY: each tick the first one's values with temperatures
  varying, energy growing and, on 2 % of nodes, corrected-ECC counters growing;
* ``--hourly-hours`` of ``gpu_hourly`` rollups per GPU before that (default 168: the model's
  7-day covariate window);
* a day of Xid noise: application Xids (13, 31) on 15 % of nodes, Xid 92 on 1 % and Xid 94 on
  0.2 % of GPUs, fatal ones (79, 48) on 0.1 %; a ``node_boot`` per node;
* a risk model (fitted on synthetic lifetimes with the telemetry covariates) and one webhook
  subscription, so that the assessment scores and the alerts queue deliveries.

Each run clones the template and times the passes as the server runs them, on the objects that
``server/background.py`` builds (``BackgroundJobs``): the assessment, then (as the leader
does after it) the planner and the alerts, the rollups and the lifecycle. First the passes of a
freshly started leader ("first"); then ``--steady-s`` of new samples are stored (every GPU, every
10 s; a fatal Xid among some application Xids) and every pass runs again ("steady"). The clock is
virtual (each pass gets its ``now``), so runs on the same template are comparable.

Per pass: wall seconds, CPU seconds of this process (the database's are in the wall time), and
the process's peak RSS during the pass (``VmHWM``, reset before each pass); at the end the peak
RSS of the whole run, which is what a leader process holding every job's state needs.

    .venv/bin/python benchmarks/background_scale.py [--nodes 12500] [--minutes 15]
        [--hourly-hours 168] [--steady-s 60] [--reseed] [--json OUT] [--dump OUT]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres] [--db-name wt_background]
        [--seed-name wt_background_seed] [--keep-minutes N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import tracemalloc
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry
from sqlalchemy import column, create_engine, func, insert, literal, select, table, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.background import BackgroundJobs  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.sample_blocks import encode_blocks  # noqa: E402
from fleetwatch.server.db.secret_box import SecretBox  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.db.tables import (  # noqa: E402
    alerts,
    events,
    evictions,
    gpu_hourly,
    gpu_lifetimes,
    gpu_sample_blocks,
    gpus,
    node_boots,
    nodes,
    webhook_outbox,
    webhook_subscriptions,
)
from fleetwatch.server.ingest.sample_writer import copy_blocks  # noqa: E402
from fleetwatch.server.ingest.store import store_batch  # noqa: E402
from fleetwatch.server.repo.sample_reader import count_samples, from_us, to_us  # noqa: E402
from fleetwatch.server.runtime.metric_families import ServerMetrics  # noqa: E402
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, Batch  # noqa: E402

GPUS_PER_NODE = 8
INTERVAL_S = 10
SKU = "NVIDIA H100 80GB HBM3"
SEED_FORMAT = 2  # bump when the seed changes, so an old template is rebuilt (2: sample blocks)
TICKS_PER_PUSH = 6  # an agent's push a minute: one block per GPU
ENCODE_GPUS = 20_000  # GPUs encoded at a time (memory: their rows as Python tuples)


def _sample(gpu_uuid: str, ts: datetime, n: int) -> dict[str, Any]:
    """All 34 canonical fields, as a healthy H100 reports them (integer temperatures, as NVML)."""
    return {
        "uuid": gpu_uuid,
        "ts": ts.isoformat(),
        "gpu_temp_c": 55 + n % 11,
        "memory_temp_c": 62 + n % 7,
        "power_w": 612.5,
        "power_limit_w": 700.0,
        "energy_mj": 10_000_000_000 + n * 1000,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "clocks_event_reasons": 0x1,  # GPU idle bit: reported, not throttled
        "power_violation_us": 0,
        "thermal_violation_us": 0,
        "fan_speed_pct": 40.0,
        "gpu_util_pct": 97.0,
        "mem_copy_util_pct": 40.0,
        "fb_used_mib": 71_000.0,
        "fb_total_mib": 81_559.0,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
        "ecc_sbe_volatile_total": n % 4,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": 20 + n % 9,
        "ecc_dbe_aggregate_total": 0,
        "retired_pages_sbe": 0,
        "retired_pages_dbe": 0,
        "retired_pages_pending": False,
        "remapped_rows_correctable": n % 3,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "nvlink_crc_flit_errors_total": 0,
        "nvlink_crc_data_errors_total": 0,
        "nvlink_replay_errors_total": 0,
        "nvlink_recovery_errors_total": 0,
        "pcie_replay_total": 0,
        "gpu_recovery_action": 0,
    }


def _node_batch(n: int, ts: datetime) -> Batch:
    name = f"gpu-{n:05d}"
    identities = [
        {
            "uuid": f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{name}/{i}')}",
            "index": i,
            "name": SKU,
            "serial": f"16{n:07d}{i:02d}",
            "pci_bus_id": f"0000:{0x18 + 0x10 * i:02x}:00.0",
            "driver_version": "550.90.07",
        }
        for i in range(GPUS_PER_NODE)
    ]
    body = {
        "batch_id": f"seed-{n}",
        "node": {
            "name": name,
            "interval_s": INTERVAL_S,
            "labels": {"cluster": f"c{n % 4}", "rack": f"r{n // 16}"},
            "boot_id": f"boot-{n}",
        },
        "gpus": identities,
        "samples": [
            _sample(g["uuid"], ts, n * GPUS_PER_NODE + i) for i, g in enumerate(identities)
        ],
        "events": [],
    }
    return Batch.model_validate_json(json.dumps(body))


@dataclass(frozen=True)
class _Fleet:
    """The seeded GPUs, by ``gpus.id``: their node, their node's boot key (``node_boots.id``) and
    the number ``n`` that :func:`_sample` gave them (node number x 8 + index)."""

    ids: NDArray[np.int64]
    node_ids: NDArray[np.int64]
    boots: list[int | None]
    n: NDArray[np.int64]


def _fleet(db: Database) -> _Fleet:
    query = (
        select(gpus.c.id, gpus.c.node_id, gpus.c.index, nodes.c.name, node_boots.c.id)
        .join(nodes, nodes.c.id == gpus.c.node_id)
        .outerjoin(
            node_boots,
            (node_boots.c.node_id == nodes.c.id) & (node_boots.c.boot_id == nodes.c.boot_id),
        )
        .order_by(gpus.c.id)
    )
    with db.read() as conn:
        rows = conn.execute(query).all()
    return _Fleet(
        ids=np.asarray([r[0] for r in rows], np.int64),
        node_ids=np.asarray([r[1] for r in rows], np.int64),
        boots=[r[4] for r in rows],
        n=np.asarray([int(r[3].removeprefix("gpu-")) * GPUS_PER_NODE + r[2] for r in rows]),
    )


def _store_push(conn: Any, fleet: _Fleet, t0: datetime, ticks: Sequence[int]) -> int:
    """Store ticks ``ticks`` (tick k at ``t0`` + k x 10 s) of every GPU as one push, one block per
    GPU; return the samples stored. Tick k has tick 0's values (:func:`_sample`) with the
    temperatures varying, the energy growing, power violations growing on two nodes in three and,
    on 2 % of the nodes, a slow corrected-ECC trickle (under every rule's threshold)."""
    first = _sample("", t0, 0)
    k_of = np.asarray(ticks, np.int64)
    stored = 0
    for lo in range(0, fleet.ids.size, ENCODE_GPUS):
        at = np.arange(lo, min(lo + ENCODE_GPUS, fleet.ids.size))
        # One row per GPU and tick, GPU by GPU.
        key = np.repeat(at, k_of.size)
        k = np.tile(k_of, at.size)
        n, node = fleet.n[key], fleet.node_ids[key]
        trickle = k * (node % 50 == 0)
        changed = {
            "gpu_temp_c": 55 + n % 11 + k % 5,
            "memory_temp_c": 62 + n % 7 + k % 3,
            "energy_mj": 10_000_000_000 + n * 1000 + k * 6_000_000,
            "power_violation_us": k * (node % 3),
            "ecc_sbe_volatile_total": n % 4 + trickle,
            "ecc_sbe_aggregate_total": 20 + n % 9 + trickle,
            "remapped_rows_correctable": n % 3,
        }
        columns = [
            changed[name].tolist() if name in changed else [first[name]] * key.size
            for name in SAMPLE_FIELD_NAMES
        ]
        times = to_us(t0) + k * INTERVAL_S * 1_000_000
        blocks = encode_blocks(key.tolist(), times.tolist(), list(zip(*columns, strict=True)))
        copy_blocks(
            conn,
            (
                (int(fleet.ids[b.gpu_key]), int(fleet.node_ids[b.gpu_key]),
                 fleet.boots[b.gpu_key], from_us(b.ts0_us), from_us(b.ts1_us), b.n, b.data)
                for b in blocks
            ),
        )  # fmt: skip
        stored += key.size
    return stored


def _store_ticks(db: Database, fleet: _Fleet, t0: datetime, ticks: range) -> int:
    """Ticks ``ticks`` of every GPU in pushes of :data:`TICKS_PER_PUSH`, a transaction each."""
    stored = 0
    for first in range(ticks.start, ticks.stop, TICKS_PER_PUSH):
        with db.write() as conn:
            stored += _store_push(
                conn, fleet, t0, range(first, min(first + TICKS_PER_PUSH, ticks.stop))
            )
    return stored


def _seed_hourly(conn: Any, before_hour: datetime, hours: int) -> int:
    """``hours`` of healthy rollups per GPU, ending before ``before_hour``."""
    sql = """
        INSERT INTO gpu_hourly (gpu_uuid, hour, node_id, samples, span_s, temp_p95_c, temp_max_c,
            throttle_reported, throttled, sbe_errors, nvlink_errors, pcie_replays, remapped_rows,
            xid_hardware, xid_memory, xid_interconnect, xid_power_thermal, xid_driver_firmware)
        SELECT g.uuid, CAST(:before AS timestamptz) - h * interval '1 hour', g.node_id, 360,
            3590.0, 60 + (g.index % 5), 62 + (g.index % 5), 360, 0,
            CASE WHEN g.node_id % 50 = 0 THEN 360 ELSE 0 END, 0, 0, g.index % 3, 0, 0, 0, 0, 0
        FROM gpus g CROSS JOIN generate_series(1, :hours) AS h
    """
    return int(conn.execute(text(sql), {"before": before_hour, "hours": hours}).rowcount)


def _seed_events(conn: Any, base: datetime) -> int:
    """A day of Xid noise and one boot per node (deterministic: chosen by hashes of the UUID)."""
    sql = """
        INSERT INTO events (node_id, gpu_uuid, pci_bus_id, kind, xid, ts, received_at, message)
        SELECT g.node_id, g.uuid, g.pci_bus_id, 'xid', x.code,
            CAST(:base AS timestamptz) - (CAST(x.hours_ago AS float8) * interval '1 hour'),
            CAST(:base AS timestamptz) - (CAST(x.hours_ago AS float8) * interval '1 hour'),
            'NVRM: Xid ' || x.code
        FROM gpus g CROSS JOIN LATERAL (VALUES
            (13, abs(hashtext(g.uuid || '13')) % 1000 < 12, 1 + abs(hashtext(g.uuid)) % 23),
            (31, abs(hashtext(g.uuid || '31')) % 1000 < 7, 2 + abs(hashtext(g.uuid)) % 21),
            (92, abs(hashtext(g.uuid || '92')) % 1000 < 10, 3 + abs(hashtext(g.uuid)) % 19),
            (94, abs(hashtext(g.uuid || '94')) % 1000 < 2, 4 + abs(hashtext(g.uuid)) % 17),
            (79, abs(hashtext(g.uuid || '79')) % 10000 < 5, 0.5),
            (48, abs(hashtext(g.uuid || '48')) % 10000 < 5, 0.2)
        ) AS x(code, chosen, hours_ago)
        WHERE x.chosen
    """
    xids = int(conn.execute(text(sql), {"base": base}).rowcount)
    boots = conn.execute(
        text(
            "INSERT INTO events (node_id, kind, ts, received_at, message) "
            "SELECT id, 'node_boot', CAST(:at AS timestamptz), CAST(:at AS timestamptz), 'boot' "
            "FROM nodes"
        ),
        {"at": base - timedelta(days=3)},
    ).rowcount
    return xids + int(boots)


def _synthetic_model(db: Database, at: datetime) -> None:
    from risk import _synthetic_bundle

    from fleetwatch.server.repo.models import store_model

    bundle = _synthetic_bundle()
    with db.write() as conn:
        store_model(conn, bundle, trigger="manual", trained_at=at)


def seed(url: str, *, nodes_n: int, minutes: int, hourly_hours: int, base: datetime) -> None:
    """Fill the (empty, migrated) database at ``url``; ``base`` is the newest tick's time."""
    settings = ServerSettings(database_url=url, background_jobs=False, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    ticks = minutes * 60 // INTERVAL_S
    t0 = base - timedelta(seconds=INTERVAL_S * (ticks - 1))
    started = time.perf_counter()
    for n in range(nodes_n):
        store_batch(db, _node_batch(n, t0), content_sha256=f"seed-{n}", now=t0)
        if n % 2500 == 2499:
            _log(f"  first tick: {n + 1} nodes stored ({time.perf_counter() - started:.0f} s)")
    fleet = _fleet(db)
    for first in range(1, ticks, TICKS_PER_PUSH):
        _store_ticks(db, fleet, t0, range(first, min(first + TICKS_PER_PUSH, ticks)))
        done = min(first + TICKS_PER_PUSH, ticks)
        _log(f"  ticks up to {done} of {ticks} stored ({time.perf_counter() - started:.0f} s)")
    with db.write() as conn:
        conn.execute(nodes.update().values(last_seen=base))
        conn.execute(gpus.update().values(last_seen=base, latest_ts=base))
        hourly = _seed_hourly(conn, t0.replace(minute=0, second=0, microsecond=0), hourly_hours)
        n_events = _seed_events(conn, base)
        conn.execute(
            insert(webhook_subscriptions).values(
                name="on-call", kind="generic", url="http://127.0.0.1:9/hook", secret=None,
                filters={}, enabled=True, created_at=base - timedelta(days=30),
            )
        )  # fmt: skip
    _log(f"  {hourly} hourly rollups, {n_events} events ({time.perf_counter() - started:.0f} s)")
    _synthetic_model(db, base - timedelta(days=1))
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    db.dispose()


def add_ticks(db: Database, *, base: datetime, seconds: int, minutes: int, after_s: int = 0) -> int:
    """``seconds`` more of samples (every GPU every 10 s) from ``after_s`` after the newest seeded
    tick at ``base`` (of ``minutes`` seeded), as agents push them (a push of up to 6 ticks a
    minute), and a few new events: application Xids on 20 GPUs and one fatal Xid."""
    newest_tick = minutes * 60 // INTERVAL_S - 1
    t0 = base - timedelta(seconds=INTERVAL_S * newest_tick)
    first = newest_tick + after_s // INTERVAL_S + 1
    stored = _store_ticks(
        db, _fleet(db), t0, range(first, newest_tick + (after_s + seconds) // INTERVAL_S + 1)
    )
    newest = base + timedelta(seconds=after_s + seconds)
    with db.write() as conn:
        conn.execute(nodes.update().values(last_seen=newest))
        conn.execute(gpus.update().values(last_seen=newest, latest_ts=newest))
        picked = conn.execute(
            select(gpus.c.uuid, gpus.c.node_id, gpus.c.pci_bus_id).order_by(gpus.c.uuid).limit(21)
        ).all()
        rows = [
            {
                "node_id": p.node_id, "gpu_uuid": p.uuid, "pci_bus_id": p.pci_bus_id,
                "kind": "xid", "xid": 79 if i == 0 else 13, "ts": newest - timedelta(seconds=5),
                "received_at": newest, "message": "steady-state Xid",
            }
            for i, p in enumerate(picked[after_s // INTERVAL_S % 2 :])
        ]  # fmt: skip
        conn.execute(insert(events), rows)
    return stored


# --- measuring ------------------------------------------------------------------------------


def _status(key: str) -> int:
    """A ``/proc/self/status`` figure in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path("/proc/self/clear_refs").write_text("5")


def _timed(name: str, run: Callable[[], Any]) -> dict[str, Any]:
    _reset_peak()
    if tracemalloc.is_tracing():
        tracemalloc.reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    traced = {}
    if tracemalloc.is_tracing():
        held, peak = tracemalloc.get_traced_memory()
        traced = {
            "traced_peak_mib": round(peak / 2**20, 1),
            "traced_held_mib": round(held / 2**20, 1),
        }
    return {
        "pass": name,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_rss_mib": round(_status("VmHWM") / 2**20, 1),
        "rss_after_mib": round(_status("VmRSS") / 2**20, 1),
        **traced,
        "result": _describe(result),
    }


def _describe(result: Any) -> str:
    if result is None:
        return "-"
    if hasattr(result, "gpus"):  # an assessment
        verdicts = sum(len(g.verdicts) for g in result.gpus)
        out = sum(1 for g in result.gpus if g.out_of_service)
        return f"{len(result.gpus)} GPUs, {verdicts} verdicts, {out} out of service"
    if hasattr(result, "created"):  # a plan
        return f"created {dict(result.created)}, cancelled {result.cancelled}"
    if hasattr(result, "fired"):  # an alert pass
        return f"fired {result.fired}, still {result.still}, resolved {result.resolved}, " \
            f"queued {result.queued}"  # fmt: skip
    if hasattr(result, "opened"):  # lifecycle counts
        return f"opened {result.opened}, failures {result.failures}"
    return str(result)


def drop_databases(server_url: str, names: Sequence[str]) -> None:
    """Drops these databases of the PostgreSQL server at ``server_url`` (a smoke run's)."""
    server = make_url(ServerSettings(database_url=server_url, _env_file=None).database_url)  # type: ignore[call-arg]
    admin_url = server.set(database="postgres").render_as_string(hide_password=False)
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for name in names:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def _clone(admin_url: str, template: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    engine.dispose()


def _seed_info(admin_url: str, db_url: str) -> dict[str, Any] | None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = make_url(db_url).database
    with engine.connect() as conn:
        exists = conn.execute(
            select(literal(1))
            .select_from(table("pg_database", column("datname")))
            .where(column("datname") == name)
        ).first()
    engine.dispose()
    if not exists:
        return None
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT info FROM bench_seed_info")).first()
    except Exception:  # noqa: BLE001 - a half-built template is rebuilt
        return None
    finally:
        engine.dispose()
    return dict(row[0]) if row else None


def _ensure_template(args: argparse.Namespace, admin_url: str, seed_url: str) -> dict[str, Any]:
    wanted = {
        "format": SEED_FORMAT,
        "nodes": args.nodes,
        "minutes": args.minutes,
        "hourly_hours": args.hourly_hours,
    }
    info = None if args.reseed else _seed_info(admin_url, seed_url)
    if info is not None and {k: info.get(k) for k in wanted} == wanted:
        _log(f"reusing template {make_url(seed_url).database} (seeded for {info['base']})")
        return info
    name = make_url(seed_url).database
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    settings = ServerSettings(database_url=seed_url, _env_file=None)  # type: ignore[call-arg]
    migrated = make_engine(settings)
    upgrade(migrated)
    migrated.dispose()
    base = datetime.now(UTC).replace(microsecond=0)
    _log(f"seeding {args.nodes} nodes x {GPUS_PER_NODE} GPUs into {name} (a child process) ...")
    started = time.perf_counter()
    if args.smoke:  # a smoke run's RSS means nothing: no interpreter of its own to start
        seed(seed_url, nodes_n=args.nodes, minutes=args.minutes,
             hourly_hours=args.hourly_hours, base=base)  # fmt: skip
    else:  # in a child process: what seeding allocates must not count in this process's RSS
        subprocess.run(
            [sys.executable, __file__, "--seed-only", "--seed-url", seed_url,
             "--nodes", str(args.nodes), "--minutes", str(args.minutes),
             "--hourly-hours", str(args.hourly_hours), "--base", base.isoformat()],
            check=True,
        )  # fmt: skip
    info = {**wanted, "base": base.isoformat(), "seed_s": round(time.perf_counter() - started)}
    engine = create_engine(seed_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_seed_info (info jsonb NOT NULL)"))
        conn.execute(text("INSERT INTO bench_seed_info VALUES (:info)"), {"info": json.dumps(info)})
    engine.dispose()
    return info


def _drop_samples_before(url: str, cutoff: datetime) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        # Whole blocks: a block with a tick at or after the cutoff stays.
        conn.execute(text("DELETE FROM gpu_sample_blocks WHERE ts1 < :cutoff"), {"cutoff": cutoff})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE gpu_sample_blocks"))
    engine.dispose()


# What the passes leave in the database, ordered, without ids: two runs (before and after a
# change, on the same template) must write the same file.
_DUMPED = (
    "SELECT gpu_uuid, hour, node_id, samples, span_s, temp_p95_c, temp_max_c, throttle_reported,"
    " throttled, sbe_errors, nvlink_errors, pcie_replays, remapped_rows, xid_hardware, xid_memory,"
    " xid_interconnect, xid_power_thermal, xid_driver_firmware FROM gpu_hourly ORDER BY 1, 2",
    "SELECT node, state, reason_kind, reason, evidence::text, expected_saving_usd, created_at"
    " FROM evictions ORDER BY 1, 7",
    "SELECT dedup_key, state, kind, severity, summary, evidence::text, occurrences FROM alerts"
    " ORDER BY 1",
    "SELECT serial, gpu_uuid, location, installed_at, removed_at, end_kind FROM gpu_lifetimes"
    " ORDER BY 1",
    "SELECT idempotency_key, payload::text FROM webhook_outbox ORDER BY 1",
)


def _dump(db: Database, path: str) -> None:
    with db.read() as conn, open(path, "w") as out:
        for query in _DUMPED:
            for row in conn.execute(text(query)):
                out.write("|".join(map(str, row)) + "\n")


def _counts(db: Database) -> dict[str, int]:
    with db.read() as conn:
        counts = {
            t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (nodes, gpus, gpu_sample_blocks, gpu_hourly, events, gpu_lifetimes,
                      evictions, alerts, webhook_outbox)
        }  # fmt: skip
        return {**counts, "samples": count_samples(conn)}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def run(args: argparse.Namespace) -> dict[str, Any]:
    server = make_url(ServerSettings(database_url=args.database_url, _env_file=None).database_url)  # type: ignore[call-arg]
    admin_url = server.set(database="postgres").render_as_string(hide_password=False)
    seed_url = server.set(database=args.seed_name).render_as_string(hide_password=False)
    run_url = server.set(database=args.db_name).render_as_string(hide_password=False)
    info = _ensure_template(args, admin_url, seed_url)
    _log(f"cloning the template into {args.db_name} ...")
    _clone(admin_url, args.seed_name, args.db_name)
    base = datetime.fromisoformat(info["base"])
    if args.keep_minutes is not None:
        _log(f"keeping only the last {args.keep_minutes} minutes of samples ...")
        _drop_samples_before(run_url, base - timedelta(minutes=args.keep_minutes))

    settings = ServerSettings(database_url=run_url, background_jobs=False, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    counts = _counts(db)
    _log(f"database: {counts}")
    jobs = BackgroundJobs(
        db,
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=base - timedelta(hours=1),  # the server has been up an hour
    )
    leader = {job.name: job.run for job in jobs.leader_jobs()}
    intervals = {
        "assessment": settings.assess_interval_s,
        "planner": settings.planner_interval_s,
        "alerts": settings.alert_interval_s,
        "rollups": settings.rollup_interval_s,
        "lifecycle": settings.lifecycle_interval_s,
    }

    def passes(label: str, now: datetime, every: bool = True) -> list[dict[str, Any]]:
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("assessment", lambda: jobs.assessor.run_once(now)),
            ("planner", lambda: jobs.planner.run_once(now)),
            ("alerts", lambda: jobs.alerter.run_once(now)),
            ("rollups", lambda: leader["rollups"](now)),
            ("lifecycle", lambda: leader["lifecycle"](now=now)),
        ]
        out = []
        for name, step in steps if every else steps[:3]:
            row = {"phase": label, "interval_s": intervals[name], **_timed(name, step)}
            traced = (
                f"  traced peak {row['traced_peak_mib']:6.0f} MiB, "
                f"held {row['traced_held_mib']:6.0f}"
                if "traced_peak_mib" in row
                else ""
            )
            _log(f"  {label:6s} {name:10s} {row['wall_s']:8.2f} s  peak RSS "
                 f"{row['peak_rss_mib']:7.0f} MiB{traced}  {row['result']}")  # fmt: skip
            out.append(row)
        return out

    if args.tracemalloc:
        # Eight frames: who called the line that allocated. Slows every pass: run it for the
        # memory, not the times.
        tracemalloc.start(8)
    _log("first passes (a leader just started) ...")
    rows = passes("first", base + timedelta(seconds=1))
    _log(f"storing {args.steady_s} s more of samples ...")
    started = time.perf_counter()
    stored = add_ticks(db, base=base, seconds=args.steady_s, minutes=args.minutes)
    _log(f"  {stored} rows in {time.perf_counter() - started:.1f} s")
    rows += passes("steady", base + timedelta(seconds=args.steady_s + 1))
    # The next assessment (and the plan and alerts after it), one interval later: no rollup
    # pass in between, as for nine assessments in ten.
    seconds = int(settings.assess_interval_s)
    add_ticks(db, base=base, seconds=seconds, minutes=args.minutes, after_s=args.steady_s)
    rows += passes("next", base + timedelta(seconds=args.steady_s + seconds + 1), every=False)
    if args.tracemalloc:
        _held_memory(args.tracemalloc)
    if args.dump:
        _dump(db, args.dump)
    db.dispose()
    return {
        "machine": _machine(),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": info,
        "database": counts,
        "steady_rows": stored,
        "keep_minutes": args.keep_minutes,
        "passes": rows,
        "peak_rss_mib_run": max(r["peak_rss_mib"] for r in rows),
    }


def _held_memory(top: int) -> None:
    """The lines whose allocations are still held after the passes (the jobs' state: windows,
    snapshot, caches), largest first, to stderr."""
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = snapshot.statistics("lineno")
    total = sum(stat.size for stat in stats)
    _log(f"held after the passes (tracemalloc): {total / 2**20:,.0f} MiB in {len(stats)} lines")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        _log(f"  {stat.size / 2**20:8.1f} MiB {stat.count:>10,} blocks  {where}")
    _log("the five largest, by call path:")
    for stat in snapshot.statistics("traceback")[:5]:
        _log(f"  {stat.size / 2**20:8.1f} MiB {stat.count:>10,} blocks")
        for frame in stat.traceback:
            _log(f"      {Path(frame.filename).name}:{frame.lineno}")


def _machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, load {load}"


def _table(result: dict[str, Any]) -> str:
    by = {(r["phase"], r["pass"]): r for r in result["passes"]}
    lines = [
        "| pass | interval | first pass s | steady pass s | next pass s | steady / interval | "
        "CPU s (first / steady / next) | peak RSS MiB (first / steady / next) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("assessment", "planner", "alerts", "rollups", "lifecycle"):
        first, steady = by[("first", name)], by[("steady", name)]
        after = by.get(("next", name))
        share = steady["wall_s"] / steady["interval_s"]
        cpu = [f"{r['cpu_s']:.1f}" for r in (first, steady, after) if r]
        rss = [f"{r['peak_rss_mib']:.0f}" for r in (first, steady, after) if r]
        next_s = f"{after['wall_s']:.2f}" if after else "-"
        lines.append(
            f"| {name} | {steady['interval_s']:g} s | {first['wall_s']:.2f} | "
            f"{steady['wall_s']:.2f} | {next_s} | {share:.0%} | {' / '.join(cpu)} | "
            f"{' / '.join(rss)} |"
        )
    lines.append(f"\npeak RSS of the whole run: {result['peak_rss_mib_run']:.0f} MiB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--minutes", type=int, default=15)
    parser.add_argument("--hourly-hours", type=int, default=168)
    parser.add_argument("--steady-s", type=int, default=60)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument(
        "--keep-minutes",
        type=int,
        default=None,
        help="delete samples older than this from the clone before the passes (a first pass "
        "that reads --minutes of the fleet's samples may not fit in memory)",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="N",
        help="trace allocations (slows every pass) and print the N lines holding the most memory "
        "after the passes",
    )
    parser.add_argument("--dump", default=None, help="write what the passes stored to this file")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "FLEETWATCH_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server (its database part is ignored)",
    )
    parser.add_argument("--db-name", default="wt_background", help="the clone the passes run on")
    parser.add_argument("--seed-name", default="wt_background_seed", help="the template")
    parser.add_argument("--seed-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed-url", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on databases of its own, dropped after"
    )
    args = parser.parse_args(argv)
    if args.seed_only:
        seed(
            args.seed_url,
            nodes_n=args.nodes,
            minutes=args.minutes,
            hourly_hours=args.hourly_hours,
            base=datetime.fromisoformat(args.base),
        )
        return
    if args.smoke:  # never the templates a real run reuses
        args.nodes, args.minutes, args.hourly_hours, args.steady_s = 3, 1, 2, 10
        args.db_name, args.seed_name = (f"fw_smoke_bg{os.getpid()}{s}" for s in ("", "_seed"))
    try:
        result = run(args)
    finally:
        if args.smoke:
            drop_databases(args.database_url, (args.db_name, args.seed_name))
    print(f"\nMachine: {result['machine']}; {result['when']}")  # noqa: T201
    print(f"Seed: {result['seed']}; rows: {result['database']}")  # noqa: T201
    print(_table(result))  # noqa: T201
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
