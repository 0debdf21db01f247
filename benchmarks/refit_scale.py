"""A refit at fleet scale on PostgreSQL: its training frame, its landmark rows and the whole
refit, timed, beside the database's own read of the rollups they need.

Seeds a fresh database (``--db-name``) with ``--gpus`` GPU lifetimes installed 30 to 400 days
before now, ``--failures-per-day`` of them failing over the last ``--days``, and hourly rollups
for every GPU over those days (generated in SQL): healthy GPUs at 60-68 degC, a failing one hot
(85 degC) with single-bit errors in its last ``--band-days``. Then, with the server's default
model settings (``model_window_days`` 7, ``model_landmark_span_days`` 90,
``model_landmark_max_rows`` 20,000, ``model_holdout_days`` 30):

* ``training_frame``: one row per lifetime with its last week of telemetry (the Weibull fits'
  and the AFT's rows);
* ``landmark_frame``: every GPU at each midnight of the span, sampled, then a week of telemetry
  before each kept row's midnight (the landmark model's rows);
* ``run_refit``: both frames and fits at now, again at the held-out window's start, the
  evaluation of every part and the store;

and, as the ceiling, the database reading the same rollups on its own: every rollup of the
week before now (what ``training_frame`` reads) with ``COPY ... TO STDOUT``.

    .venv/bin/python benchmarks/refit_scale.py [--gpus 2000] [--days 130] [--smoke]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres] [--db-name NAME]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.repo.models import get_model  # noqa: E402
from fleetwatch.server.upkeep.landmark_frame import landmark_frame  # noqa: E402
from fleetwatch.server.upkeep.refit import landmark_horizons_days, run_refit  # noqa: E402
from fleetwatch.server.upkeep.training_frame import training_frame  # noqa: E402

_LIFETIMES_SQL = """
    INSERT INTO gpu_lifetimes (serial, gpu_uuid, sku, installed_at, removed_at, end_kind, source)
    SELECT 'S' || g, 'GPU-' || g, 'H100',
        CAST(:now AS timestamptz) - (30 + (g * 7919 % 371)) * interval '1 day',
        CASE WHEN g < :failing
            THEN CAST(:now AS timestamptz) - :days * interval '1 day'
                 + (g + 0.5) * (:days * interval '1 day') / :failing END,
        CASE WHEN g < :failing THEN 'failure' END,
        'observed'
    FROM generate_series(0, :gpus - 1) AS g
"""
_HOURLY_SQL = """
    INSERT INTO gpu_hourly (gpu_uuid, hour, node_id, samples, span_s, temp_p95_c, temp_max_c,
        throttle_reported, throttled, sbe_errors, nvlink_errors, pcie_replays, remapped_rows,
        xid_hardware, xid_memory, xid_interconnect, xid_power_thermal, xid_driver_firmware)
    SELECT l.gpu_uuid, h, l.id / 8, 360, 3590.0,
        CASE WHEN hot THEN 85.0 ELSE 60 + l.id % 9 END,
        CASE WHEN hot THEN 88.0 ELSE 62 + l.id % 9 END,
        360, 0, CASE WHEN hot THEN 40 ELSE 0 END, 0, 0, 0, 0, 0, 0, 0, 0
    FROM gpu_lifetimes l
    CROSS JOIN LATERAL generate_series(
        date_trunc('hour', CAST(:now AS timestamptz) - :days * interval '1 day'),
        coalesce(l.removed_at, CAST(:now AS timestamptz)) - interval '1 hour',
        interval '1 hour') AS h
    CROSS JOIN LATERAL (SELECT l.removed_at IS NOT NULL
        AND l.removed_at - h <= :band * interval '1 day' AS hot) AS band
"""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _recreate(admin_url: str, name: str) -> str:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def _drop(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def seed(db: Database, args: argparse.Namespace, now: datetime) -> int:
    failing = args.failures_per_day * int(args.days)
    with db.write() as conn:
        conn.execute(
            text(_LIFETIMES_SQL),
            {"now": now, "gpus": args.gpus, "failing": failing, "days": args.days},
        )
        rows = conn.execute(
            text(_HOURLY_SQL), {"now": now, "days": args.days, "band": args.band_days}
        ).rowcount
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return int(rows)


def _timed(label: str, run: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - began
    _log(f"  {label}: {seconds:.1f} s")
    return seconds, out


def _copy_week(db: Database, now: datetime) -> int:
    """The database's own read of the week of rollups before ``now``, every column, as text."""
    raw = db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        since = (now - timedelta(days=7)).isoformat()
        query = f"COPY (SELECT * FROM gpu_hourly WHERE hour >= '{since}') TO STDOUT"
        size = 0
        with cursor.copy(query) as copy:
            for block in copy:
                size += len(block)
        return size
    finally:
        raw.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--days", type=float, default=130.0, help="days of hourly rollups")
    parser.add_argument("--failures-per-day", type=int, default=2)
    parser.add_argument("--band-days", type=float, default=3.0)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    # A name of its own per process: two runs on one server (a CI clone and a checkout) would
    # drop each other's database.
    parser.add_argument("--db-name", default=f"wt_refit_{os.getpid()}")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.days, args.failures_per_day = 60, 45.0, 1
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    load = os.getloadavg()
    print(
        f"nproc {os.cpu_count()}, Python {platform.python_version()}, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at start; {args.gpus} GPUs, "
        f"{args.days:g} days of hourly rollups, {args.failures_per_day} failures a day"
    )
    url = _recreate(args.database_url, args.db_name)
    settings = ServerSettings(database_url=url, background_jobs=False, _env_file=None)
    if args.smoke:
        settings = settings.model_copy(
            update={"model_landmark_span_days": 20.0, "model_holdout_days": 10.0}
        )
    engine = make_engine(settings)
    upgrade(engine)
    db = Database(engine)
    try:
        seeded, rollups = _timed("seed", lambda: seed(db, args, now))
        horizons = landmark_horizons_days(settings)
        with db.read() as conn:
            frame_s, frame = _timed(
                "training_frame",
                lambda: training_frame(conn, now=now, window_days=settings.model_window_days),
            )
            marks_s, (marks_x, _) = _timed(
                "landmark_frame",
                lambda: landmark_frame(
                    conn,
                    now=now,
                    span_days=settings.model_landmark_span_days,
                    window_days=settings.model_window_days,
                    horizons_days=horizons,
                    max_rows=settings.model_landmark_max_rows,
                ),
            )
        copy_s, copied = _timed("COPY of the week's rollups", lambda: _copy_week(db, now))
        refit_s, version = _timed(
            "run_refit", lambda: run_refit(db, settings, trigger="manual", now=now)
        )
        with db.read() as conn:
            stored = get_model(conn, version)
        evaluation = stored.evaluation or {}
        scores = {
            k: f"{v['auc']:.3f}" if v.get("auc") is not None else "-"
            for k, v in (evaluation.get("scorers") or {}).items()
        }
        print(f"seeded {rollups:,} hourly rollups in {seeded:.1f} s")
        table = [
            ("training_frame (a week of telemetry per lifetime)", f"{len(frame):,}", frame_s),
            ("landmark_frame (sampled GPU-days, a week before each)", f"{len(marks_x):,}", marks_s),
            (f"ceiling: COPY of the week's rollups ({copied / 1e6:.0f} MB)", "-", copy_s),
            ("run_refit (both frames and fits twice, the evaluation)", "-", refit_s),
        ]
        print("| step | rows | seconds |\n|---|---:|---:|")
        for step, rows, seconds in table:
            print(f"| {step} | {rows} | {seconds:.1f} |")
        print(
            f"version {version}: {stored.status}, serving part {evaluation.get('scorer')}, "
            f"window AUC by part {scores}"
        )
    finally:
        db.dispose()
        if not args.keep:
            _drop(args.database_url, args.db_name)


if __name__ == "__main__":
    main()
