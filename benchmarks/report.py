"""The weekly report at fleet scale: 100,000 GPUs over one simulated week, on SQLite.

Seeds, in bulk through sqlite3 (not timed): 12,500 nodes of 8 GPUs (32 nodes a rack; H100/A100;
three drivers), one open lifetime per GPU installed over the past two years plus ``--history``
ended ones (failures, retirements) for the survival curves, ~0.3 % of GPUs failing in the week
(two thirds replaced a day later), drains with returns (half near a failure), Xid events,
stragglers, 2,000 jobs with outcomes, checkpoints and restarts (issue 14), hourly rollups for
the week's last ``--rollup-hours`` hours, one energy sample a GPU a day, and a Weibull risk
model per SKU trained before the week. Then times each stage of the report: loading, compute
(total, and its survival, calibration and availability parts), JSON, HTML (with its plots) and
optionally the PDF.

    .venv/bin/python benchmarks/report.py [--gpus 100000] [--history 30000] [--rollup-hours 24]
        [--pdf] [--db /tmp/fleetwatch-report.db]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.models.registry import PARAMS_FORMAT  # noqa: E402
from fleetwatch.reports.availability import compute_availability  # noqa: E402
from fleetwatch.reports.calibration import calibration  # noqa: E402
from fleetwatch.reports.render import render_html, render_pdf  # noqa: E402
from fleetwatch.reports.survival import km_by_sku  # noqa: E402
from fleetwatch.reports.weeks import parse_week  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.sample_blocks import encode_blocks  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.repo.availability_rows import load_period, sla_targets  # noqa: E402
from fleetwatch.server.repo.report_rows import compute_weekly, load_week  # noqa: E402
from fleetwatch.server.repo.sample_reader import from_us, to_us  # noqa: E402
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES  # noqa: E402

WEEK = parse_week("2026-W48")
START, END = WEEK.start, WEEK.end
XIDS = np.array([13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119])
XID_P = np.array([25, 20, 10, 20, 2, 5, 1, 4, 1, 5, 3, 2, 2], dtype=float)


def ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def at(hours: float) -> str:
    return ts(START + timedelta(hours=float(hours)))


def seed(
    path: Path, n_gpus: int, history: int, rollup_hours: int, rng: np.random.Generator
) -> None:
    db = Database(make_engine(ServerSettings(database_url=f"sqlite:///{path}")))
    upgrade(db.engine)
    db.dispose()
    con = sqlite3.connect(path)
    con.execute("PRAGMA synchronous=OFF")
    con.execute("PRAGMA journal_mode=OFF")
    n_nodes = n_gpus // 8
    far, now = ts(datetime(2024, 1, 1, tzinfo=UTC)), ts(END + timedelta(days=1))
    con.executemany(
        "INSERT INTO nodes (id, name, labels, interval_s, first_seen, last_seen) "
        "VALUES (?, ?, ?, 10.0, ?, ?)",
        ((i + 1, f"node-{i:05d}", json.dumps({"rack": f"r{i // 32:04d}", "cluster": "c1"}),
          far, now) for i in range(n_nodes)),
    )  # fmt: skip
    sku = np.where(rng.random(n_gpus) < 0.7, "H100", "A100")
    drivers = rng.choice(["550.90.07", "550.54.15", "535.161.08"], n_gpus)
    con.executemany(
        "INSERT INTO gpus (id, uuid, node_id, \"index\", serial, name, driver_version, first_seen, "
        "last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ((g + 1, f"GPU-{g:06d}", g // 8 + 1, g % 8, f"SN{g:07d}", sku[g], drivers[g], far, now)
         for g in range(n_gpus)),
    )  # fmt: skip
    age_h = rng.uniform(24 * 30, 24 * 730, n_gpus)
    fails = rng.random(n_gpus) < 0.003
    fail_at = rng.uniform(0, 168, n_gpus)
    replaced = rng.random(n_gpus) < 2 / 3
    causes = rng.choice(["DBE", "fell off the bus", "NVLink", "row remap failure", ""], n_gpus)
    lifetimes = []
    for g in range(n_gpus):
        loc, node = f"node-{g // 8:05d}/gpu{g % 8}", g // 8 + 1
        if fails[g]:
            lifetimes.append((f"SN{g:07d}", f"GPU-{g:06d}", node, loc, sku[g], at(-age_h[g]),
                              at(fail_at[g]), "failure", causes[g] or None))  # fmt: skip
            if replaced[g] and fail_at[g] + 24 < 168:
                lifetimes.append((f"SNR{g:07d}", None, node, loc, sku[g], at(fail_at[g] + 24),
                                  None, None, None))  # fmt: skip
        else:
            lifetimes.append((f"SN{g:07d}", f"GPU-{g:06d}", node, loc, sku[g], at(-age_h[g]),
                              None, None, None))  # fmt: skip
    for h in range(history):
        start_h = -rng.uniform(24 * 400, 24 * 1500)
        life_h = rng.weibull(1.3) * 24 * 500
        kind = "failure" if rng.random() < 0.7 else "retirement"
        end_h = min(start_h + life_h, -24.0 * 60)
        lifetimes.append((f"SNH{h:07d}", None, None, f"old/{h}", rng.choice(["H100", "A100"]),
                          at(start_h), at(end_h), kind, None))  # fmt: skip
    con.executemany(
        "INSERT INTO gpu_lifetimes (serial, gpu_uuid, node_id, location, sku, installed_at, "
        "removed_at, end_kind, cause, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'import')",
        lifetimes,
    )
    failed = np.flatnonzero(fails)
    evictions = []
    drained = list(failed[: len(failed) // 2]) + list(rng.integers(0, n_gpus, len(failed) // 2))
    for k, g in enumerate(drained):
        node = f"node-{g // 8:05d}"
        t = fail_at[g] - 2 if k < len(failed) // 2 else rng.uniform(0, 168)
        back = t + rng.uniform(2, 48)
        evictions.append((node, "returned" if back < 168 else "completed",
                          rng.choice(["rule", "risk", "straggler"]), "bench", at(t - 0.5),
                          at(t - 0.5), at(t), at(back) if back < 168 else None))  # fmt: skip
    con.executemany(
        "INSERT INTO evictions (node, state, reason_kind, reason, dry_run, created_at, "
        "updated_at, completed_at, returned_at) VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?)",
        evictions,
    )
    n_events = n_gpus // 2
    ev_gpu = rng.integers(0, n_gpus, n_events)
    ev_xid = rng.choice(XIDS, n_events, p=XID_P / XID_P.sum())
    ev_t = rng.uniform(-24, 192, n_events)
    con.executemany(
        "INSERT INTO events (node_id, gpu_uuid, kind, xid, ts, received_at) "
        "VALUES (?, ?, 'xid', ?, ?, ?)",
        ((int(g) // 8 + 1, f"GPU-{g:06d}", int(x), at(t), at(t))
         for g, x, t in zip(ev_gpu, ev_xid, ev_t, strict=True)),
    )  # fmt: skip
    con.executemany(
        "INSERT INTO stragglers (job_id, node, kind, started_at, updated_at, windows, ratio) "
        "VALUES (?, ?, 'hardware', ?, ?, 3, ?)",
        ((f"job-{i % 50}", f"node-{int(rng.integers(0, n_nodes)):05d}", at(t), at(t),
          float(1.25 + rng.exponential(0.2))) for i, t in enumerate(rng.uniform(0, 168, 2000))),
    )  # fmt: skip
    seed_jobs(con, n_nodes, rng)
    hourly_cols = ("gpu_uuid, hour, node_id, samples, span_s, throttle_reported, throttled, "
                   "xid_hardware, xid_memory, xid_interconnect, xid_power_thermal, "
                   "xid_driver_firmware")  # fmt: skip
    for h in range(168 - rollup_hours, 168):
        con.executemany(
            f"INSERT INTO gpu_hourly ({hourly_cols}) "
            "VALUES (?, ?, ?, 360, 3590, 0, 0, 0, 0, 0, 0, 0)",
            ((f"GPU-{g:06d}", at(h), g // 8 + 1) for g in range(n_gpus)),
        )
    energy = rng.uniform(0, 1e12, n_gpus)
    for day in range(8):
        hour = min(day * 24, 167.9)
        energy = energy + rng.uniform(4e10, 6e10, n_gpus)  # ~600 W x 24 h in mJ
        seed_energy(con, START + timedelta(hours=hour), energy)
    params = {"format": PARAMS_FORMAT, "aft": None,
              "fleet": {"lambda": 900.0, "rho": 1.3, "rho_ci": [1.2, 1.4]},
              "groups": {"H100": {"lambda": 800.0, "rho": 1.3, "rho_ci": [1.2, 1.4]},
                         "A100": {"lambda": 1100.0, "rho": 1.2, "rho_ci": [1.1, 1.3]}}}  # fmt: skip
    con.execute(
        'INSERT INTO risk_models (trained_at, "trigger", status, params) '
        "VALUES (?, 'manual', 'ok', ?)",
        (ts(START - timedelta(days=2)), json.dumps(params)),
    )
    con.commit()
    con.close()


_ENERGY, _POWER = SAMPLE_FIELD_NAMES.index("energy_mj"), SAMPLE_FIELD_NAMES.index("power_w")


def seed_energy(con: sqlite3.Connection, when: datetime, energy: np.ndarray) -> None:
    """One sample a GPU at ``when`` reporting energy (``energy[g]``) and 600 W alone: a block of
    one tick per GPU, encoded as the server encodes them."""
    fields: list[Any] = [None] * len(SAMPLE_FIELD_NAMES)
    rows = []
    for value in energy.astype(np.int64).tolist():
        fields[_ENERGY], fields[_POWER] = value, 600.0
        rows.append(tuple(fields))
    blocks = encode_blocks(range(1, energy.size + 1), [to_us(when)] * energy.size, rows)
    con.executemany(
        "INSERT INTO gpu_sample_blocks (gpu_id, node_id, ts0, ts1, n, data) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        ((b.gpu_key, (b.gpu_key - 1) // 8 + 1, ts(from_us(b.ts0_us)), ts(from_us(b.ts1_us)), b.n,
          b.data) for b in blocks),
    )  # fmt: skip


def seed_jobs(con: sqlite3.Connection, n_nodes: int, rng: np.random.Generator) -> None:
    """Issue 14's job reports: 2,000 jobs of 1-128 nodes (8 ranks a node) running in the week,
    ~20 % failed, 10 % cancelled; a checkpoint every 30 min of each; a restart for each failed
    job that was requeued (half of them); the job ids match the seeded straggler verdicts."""
    jobs, ckpts, restarts = [], [], []
    for j in range(2000):
        size = int(min(2 ** rng.integers(0, 8), n_nodes))
        first = int(rng.integers(0, n_nodes - size + 1))
        names = [f"node-{first + k:05d}" for k in range(size)]
        start = float(rng.uniform(-48, 160))
        end = start + float(rng.exponential(24))
        outcome = rng.choice(["completed", "failed", "cancelled"], p=[0.7, 0.2, 0.1])
        running = end > 168
        ended = (None, None) if running else (at(end), str(outcome))
        jobs.append((f"job-{j}", at(start), at(min(end, 168)), size * 8, json.dumps(names),
                     at(start), *ended))  # fmt: skip
        for t in np.arange(start + 0.5, min(end, 168), 0.5):
            ckpts.append((f"job-{j}", at(t), float(rng.uniform(20, 120)), int(t * 100)))
        if outcome == "failed" and rng.random() < 0.5 and end + 1 < 168:
            restarts.append((f"job-{j}", at(end + 0.3), at(end), int(rng.integers(0, 3000)),
                             float(rng.uniform(0, 1800))))  # fmt: skip
    con.executemany(
        "INSERT INTO jobs (job_id, first_seen, last_seen, ranks, nodes, started_at, ended_at, "
        "outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        jobs,
    )
    con.executemany(
        "INSERT INTO job_checkpoints (job_id, started_at, duration_s, step) VALUES (?, ?, ?, ?)",
        ckpts,
    )
    con.executemany(
        "INSERT INTO job_restarts (job_id, resumed_at, interrupted_at, lost_steps, lost_s) "
        "VALUES (?, ?, ?, ?, ?)",
        restarts,
    )


def timed(label: str, results: list[tuple[str, float]], fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    began = time.perf_counter()
    value = fn(*args, **kwargs)
    results.append((label, time.perf_counter() - began))
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=30_000)
    parser.add_argument("--rollup-hours", type=int, default=24)
    parser.add_argument("--pdf", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.history, args.rollup_hours = 400, 200, 2
    path = args.db or Path(tempfile.mkdtemp(prefix="fw-report-")) / "report.db"
    if not path.exists():
        began = time.perf_counter()
        seed(path, args.gpus, args.history, args.rollup_hours, np.random.default_rng(args.seed))
        print(f"seeded {path} in {time.perf_counter() - began:.1f} s "
              f"({path.stat().st_size / 1e6:.0f} MB)")  # fmt: skip
    settings = ServerSettings(database_url=f"sqlite:///{path}")  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    now = END + timedelta(hours=6)
    results: list[tuple[str, float]] = []
    with db.read() as conn:
        data = timed("load rows (one week)", results, load_week, conn, WEEK)
        timed("  survival (Kaplan-Meier by SKU)", results, km_by_sku, data.lifetimes, END)
        timed("  calibration (risk model scoring)", results, calibration, data.model,
              data.lifetimes, START, END)  # fmt: skip
        period = timed("  availability rows (load_period)", results, load_period, conn, START,
                       END, settings=settings)  # fmt: skip
        timed("  availability figures (compute_availability)", results, compute_availability,
              period, sla_targets(settings), by=("sku", "rack"))  # fmt: skip
        report = timed("compute (total, incl. both weeks' loads)", results, compute_weekly,
                       conn, WEEK, settings=settings, now=now)  # fmt: skip
    db.dispose()
    body = timed("JSON", results, json.dumps, report.to_dict())
    html = timed("HTML (jinja2 + 3 matplotlib plots)", results, render_html, report)
    if args.pdf:
        pdf = timed("PDF (weasyprint)", results, render_pdf, report, html)
        print(f"PDF {len(pdf) / 1e3:.0f} kB")
    total = sum(s for label, s in results if label.startswith(("compute", "HTML")))
    print(f"{args.gpus:,} GPUs, {len(data.lifetimes):,} lifetimes, {len(data.events):,} events, "
          f"{len(data.samples):,} energy samples, JSON {len(body) / 1e3:.0f} kB, "
          f"HTML {len(html) / 1e3:.0f} kB")  # fmt: skip
    print("| stage | seconds |\n|---|---:|")
    for label, seconds in results:
        print(f"| {label} | {seconds:.2f} |")
    print(f"| **compute + HTML** | **{total:.2f}** (target ≤ 60) |")
    head = report.headline
    print("headline:", {k: round(v, 4) if isinstance(v, float) else v for k, v in head.items()})
    print("calibration:", {k: v for k, v in report.calibration.items() if k != "deciles"})
    a = report.availability or {}
    print("availability:", a.get("fleet"))
    print("jobs:", a.get("jobs"), "goodput:", a.get("goodput"))
    print(
        f"availability rows: {len(period.outages):,} outages, {len(period.jobs):,} jobs, "
        f"{len(period.checkpoints):,} checkpoints, {len(period.restarts):,} restarts"
    )


if __name__ == "__main__":
    main()
