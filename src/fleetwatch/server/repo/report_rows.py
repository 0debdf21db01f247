"""The rows a weekly report is computed from, read in a handful of queries per week.

:func:`compute_weekly` is the report of one week from the database: it loads the week and the week
before (:func:`load_week`) and hands their rows to :func:`fleetwatch.reports.weekly.build_weekly`.
"""

from __future__ import annotations

from collections import Counter, namedtuple
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select

from fleetwatch.config import ServerSettings
from fleetwatch.reports.availability import compute_availability
from fleetwatch.reports.daily import daily_figures, day_starts
from fleetwatch.reports.rows import CONFIRM_WINDOW, WeekData
from fleetwatch.reports.week_pictures import REPORT_TREND_DAYS, day_dicts, week_end_states
from fleetwatch.reports.weekly import WeeklyReport, build_weekly
from fleetwatch.reports.weeks import IsoWeek
from fleetwatch.rules.host_errors import HOST_KINDS
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.tables import (
    events,
    evictions,
    gpu_hourly,
    gpu_lifetimes,
    gpus,
    nodes,
    risk_models,
    stragglers,
)
from fleetwatch.server.repo.availability_rows import load_outages, load_period, sla_targets
from fleetwatch.server.repo.hourly_features import window_features_before
from fleetwatch.server.repo.notice_savings_rows import compute_notice_savings
from fleetwatch.server.repo.sample_reader import read_samples, sample_rows

__all__ = ["compute_weekly", "load_week"]

# Evictions this old at the week's start are read only while their node is still out.
_EVICTION_LOOKBACK = timedelta(days=60)
# Every host-error severity that may drain (rules.host_errors decides which do, per kind).
_INTERRUPTING = ("fatal", "non_fatal", "uncorrected")


# The labels the report breaks MTBF and MTTR down by.
REPORT_LABELS = ("sku", "rack")


def compute_weekly(
    conn: Connection,
    week: IsoWeek,
    *,
    settings: ServerSettings,
    catalog: XidCatalog | None = None,
    now: datetime | None = None,
) -> WeeklyReport:
    """The report for ``week``; lifetimes still open at ``now`` are censored there (KM)."""
    period = load_period(conn, week.start, week.end, settings=settings)
    starts = day_starts(week.end - timedelta(microseconds=1), REPORT_TREND_DAYS)
    days = daily_figures(load_outages(conn, starts[0], week.end), starts)
    window = timedelta(days=settings.model_window_days)
    return build_weekly(
        load_week(conn, week, feature_window=window),
        load_week(conn, week.previous()),
        settings=settings,
        catalog=catalog,
        now=now or datetime.now(UTC),
        availability=compute_availability(period, sla_targets(settings), by=REPORT_LABELS),
        notice_savings=compute_notice_savings(conn, week.start, week.end, settings=settings),
        fleet_states=week_end_states(period, week.end),
        days=day_dicts(days),
    )


def load_week(
    conn: Connection,
    week: IsoWeek,
    *,
    with_samples: bool = True,
    feature_window: timedelta | None = None,
) -> WeekData:
    """The week's rows; with ``feature_window``, also each GPU's telemetry covariates over that
    window before the week's start (the drain curve's; the week before needs none)."""
    start, end = week.start, week.end
    node_rows = conn.execute(
        select(nodes.c.id, nodes.c.name, nodes.c.labels, nodes.c.first_seen, nodes.c.last_seen)
    ).all()
    gpu_rows = conn.execute(
        select(gpus.c.uuid, gpus.c.node_id, gpus.c.name, gpus.c.driver_version)
    ).all()
    hourly = conn.execute(
        select(func.count()).where(gpu_hourly.c.hour >= start, gpu_hourly.c.hour < end)
    ).scalar_one()
    return WeekData(
        week=week,
        lifetimes=_lifetimes(conn, end),
        nodes={row.id: row for row in node_rows},
        node_ids={row.name: row.id for row in node_rows},
        gpus={row.uuid: row for row in gpu_rows},
        gpus_per_node=Counter(row.node_id for row in gpu_rows),
        evictions=_evictions(conn, start, end),
        events=_events(conn, start - CONFIRM_WINDOW, end + CONFIRM_WINDOW),
        stragglers=_stragglers(conn, start, end),
        reporting_gpu_hours=int(hourly),
        samples=_samples(conn, start, end) if with_samples else [],
        model=_model_at(conn, start),
        features=(
            {}
            if feature_window is None
            else window_features_before(conn, end=start, window=feature_window)
        ),
    )


def _lifetimes(conn: Connection, end: datetime) -> list[Any]:
    lt = gpu_lifetimes.c
    columns = (
        lt.serial,
        lt.gpu_uuid,
        lt.node_id,
        lt.location,
        lt.sku,
        lt.installed_at,
        lt.removed_at,
        lt.end_kind,
        lt.cause,
    )
    query = select(*columns).where(lt.installed_at < end).order_by(lt.id)
    return list(conn.execute(query).all())


def _evictions(conn: Connection, start: datetime, end: datetime) -> list[Any]:
    ev = evictions.c
    columns = (
        ev.id,
        ev.node,
        ev.state,
        ev.reason_kind,
        ev.dry_run,
        ev.created_at,
        ev.completed_at,
        ev.returned_at,
        ev.repeat_of,
    )
    recent_or_still_out = or_(
        ev.created_at >= start - _EVICTION_LOOKBACK,
        ev.returned_at.is_(None),
        ev.returned_at >= start,
    )
    query = select(*columns).where(ev.created_at < end).where(recent_or_still_out)
    return list(conn.execute(query).all())


def _events(conn: Connection, lo: datetime, hi: datetime) -> list[Any]:
    """Xid and lost-GPU events, host errors at the severities that may interrupt (corrected
    floods stay in the database: the report does not count them), and ports gone down or
    flapping past their limit."""
    e = events.c
    severity = e.details["severity"].as_string()
    host = and_(e.kind.in_(sorted(HOST_KINDS)), severity.in_(_INTERRUPTING))
    # A port down, a flap at its limit (rules.port_events marks them critical).
    ports = and_(e.kind.in_(("port_down", "port_flap")), severity.in_(("critical", "fatal")))
    query = select(e.node_id, e.gpu_uuid, e.kind, e.xid, e.ts, e.details).where(
        or_(e.kind.in_(("xid", "gpu_lost")), host, ports), e.ts >= lo, e.ts < hi
    )
    return list(conn.execute(query).all())


def _stragglers(conn: Connection, start: datetime, end: datetime) -> list[Any]:
    st = stragglers.c
    query = select(st.job_id, st.node, st.kind, st.started_at, st.ended_at, st.ratio).where(
        st.started_at >= start, st.started_at < end
    )
    return list(conn.execute(query).all())


# A sample as the report's energy figures read it.
_EnergyReading = namedtuple("_EnergyReading", ["gpu_uuid", "ts", "energy_mj", "power_w"])


def _samples(conn: Connection, start: datetime, end: datetime) -> list[Any]:
    """The week's samples that report energy or power, by GPU, then time."""
    uuid_of = dict(conn.execute(select(gpus.c.id, gpus.c.uuid)).all())
    out = [
        _EnergyReading(uuid_of[row[1]], row[0], row[4], row[5])
        for chunk in read_samples(conn, ("energy_mj", "power_w"), since=start, before=end)
        for row in sample_rows(chunk)
        if row[4] is not None or row[5] is not None
    ]
    out.sort(key=lambda reading: (reading.gpu_uuid, reading.ts))
    return out


def _model_at(conn: Connection, at: datetime) -> Any | None:
    """The newest good risk model trained by ``at``: ``version`` and ``params``."""
    rm = risk_models.c
    query = (
        select(rm.version, rm.params)
        .where(rm.status == "ok", rm.trained_at <= at)
        .order_by(rm.trained_at.desc(), rm.version.desc())
        .limit(1)
    )
    return conn.execute(query).first()
