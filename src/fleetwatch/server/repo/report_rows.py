"""The rows one weekly report reads, loaded once per week with a handful of queries."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, or_, select

from fleetwatch.reports.weeks import IsoWeek
from fleetwatch.server.db.tables import (
    events,
    evictions,
    gpu_hourly,
    gpu_lifetimes,
    gpu_samples,
    gpus,
    nodes,
    stragglers,
)

__all__ = ["CONFIRM_WINDOW", "WeekData", "load_week"]

# A drain is confirmed by a failure or a fatal event this close to it, either side.
CONFIRM_WINDOW = timedelta(hours=24)


@dataclass
class WeekData:
    week: IsoWeek
    # SQLAlchemy rows, read by attribute (column names); Any because Row's arity varies.
    lifetimes: list[Any]
    nodes: dict[int, Any]
    node_ids: dict[str, int]
    gpus: dict[str, Any]
    gpus_per_node: Counter[int]
    evictions: list[Any]
    events: list[Any]
    stragglers: list[Any]
    reporting_gpu_hours: int
    samples: list[Any] = field(default_factory=list)

    @property
    def start(self) -> datetime:
        return self.week.start

    @property
    def end(self) -> datetime:
        return self.week.end


def load_week(conn: Connection, week: IsoWeek, *, with_samples: bool = True) -> WeekData:
    start, end = week.start, week.end
    lo, hi = start - CONFIRM_WINDOW, end + CONFIRM_WINDOW
    lt = gpu_lifetimes.c
    lifetimes = conn.execute(
        select(lt.serial, lt.gpu_uuid, lt.node_id, lt.location, lt.sku, lt.installed_at,
               lt.removed_at, lt.end_kind, lt.cause)
        .where(lt.installed_at < end)
        .order_by(lt.id)
    ).all()  # fmt: skip
    node_rows = conn.execute(
        select(nodes.c.id, nodes.c.name, nodes.c.labels, nodes.c.first_seen, nodes.c.last_seen)
    ).all()
    gpu_rows = conn.execute(
        select(gpus.c.uuid, gpus.c.node_id, gpus.c.name, gpus.c.driver_version)
    ).all()
    ev = evictions.c
    eviction_rows = conn.execute(
        select(ev.id, ev.node, ev.state, ev.reason_kind, ev.dry_run, ev.created_at,
               ev.completed_at, ev.returned_at)
        .where(ev.created_at < end)
        .where(or_(ev.created_at >= start - timedelta(days=60), ev.returned_at.is_(None),
                   ev.returned_at >= start))
    ).all()  # fmt: skip
    event_rows = conn.execute(
        select(events.c.node_id, events.c.gpu_uuid, events.c.kind, events.c.xid, events.c.ts).where(
            events.c.kind.in_(("xid", "gpu_lost")), events.c.ts >= lo, events.c.ts < hi
        )
    ).all()
    st = stragglers.c
    straggler_rows = conn.execute(
        select(st.job_id, st.node, st.kind, st.started_at, st.ended_at, st.ratio).where(
            st.started_at >= start, st.started_at < end
        )
    ).all()
    hourly = conn.execute(
        select(func.count()).where(gpu_hourly.c.hour >= start, gpu_hourly.c.hour < end)
    ).scalar_one()
    samples: list[Any] = []
    if with_samples:
        gs = gpu_samples.c
        samples = list(
            conn.execute(
                select(gs.gpu_uuid, gs.ts, gs.energy_mj, gs.power_w)
                .where(gs.ts >= start, gs.ts < end)
                .where(or_(gs.energy_mj.is_not(None), gs.power_w.is_not(None)))
                .order_by(gs.gpu_uuid, gs.ts)
            )
        )
    return WeekData(
        week=week,
        lifetimes=list(lifetimes),
        nodes={row.id: row for row in node_rows},
        node_ids={row.name: row.id for row in node_rows},
        gpus={row.uuid: row for row in gpu_rows},
        gpus_per_node=Counter(row.node_id for row in gpu_rows),
        evictions=list(eviction_rows),
        events=list(event_rows),
        stragglers=list(straggler_rows),
        reporting_gpu_hours=int(hourly),
        samples=samples,
    )
