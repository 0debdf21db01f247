"""One ISO week of fleet reliability from the week's rows (definitions in docs/telling.md).

:func:`build_weekly` takes the rows of the week and of the week before (:class:`WeekData`; the
server loads them, :func:`fleetwatch.server.repo.report_rows.compute_weekly`). Every figure is a
plain number so that the report serialises to JSON as it is; ``render_html`` and ``render_pdf``
only lay it out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetwatch.config import ServerSettings
from fleetwatch.reports.calibration import calibration
from fleetwatch.reports.components import interruptions_by_component
from fleetwatch.reports.drain_curve import drain_curve
from fleetwatch.reports.reliability import availability, hours, mtbf_hours, mttr_hours
from fleetwatch.reports.reliability import overlap_hours as overlap
from fleetwatch.reports.rows import WeekData
from fleetwatch.reports.survival import km_by_sku
from fleetwatch.reports.week_lifetimes import (
    drains,
    failures,
    installs,
    near,
    replaced_at,
    replacements,
    within,
)
from fleetwatch.rules.host_errors import is_urgent_host_event
from fleetwatch.rules.port_health import is_urgent_port_event
from fleetwatch.rules.xid_catalog import XidCatalog

__all__ = ["HEADLINE", "WeeklyReport", "build_weekly", "headline"]

TOP = 10
HEADLINE = (
    "gpu_mtbf_h",
    "gpu_mttr_h",
    "gpu_availability",
    "node_mtbf_h",
    "node_mttr_h",
    "node_availability",
    "gpu_failures",
    "node_outages",
    "drains",
    "false_drain_rate",
    "goodput_ratio",
    "gpu_hours_lost",
    "usd_lost",
    "energy_kwh",
    "stragglers",
)
# A slot still empty this long after its GPU failed counts as decommissioned, no longer as down.
OPEN_SLOT_LIMIT = timedelta(days=7)


@dataclass
class WeeklyReport:
    """The report's sections; ``to_dict()`` is the JSON body."""

    week: str
    start: str
    end: str
    generated_at: str
    headline: dict[str, Any]
    reliability: dict[str, Any]
    interruptions: dict[str, Any]
    goodput: dict[str, Any]
    energy: dict[str, Any]
    drains: dict[str, Any]
    calibration: dict[str, Any]
    offenders: dict[str, Any]
    survival: dict[str, Any]
    stragglers: dict[str, Any]
    deltas: dict[str, Any]
    sla: dict[str, Any]
    # Issue 14's figures (:mod:`fleetwatch.reports.availability`), when the caller computed them.
    availability: dict[str, Any] | None = None
    # Issue 15's work saved by notices (:mod:`fleetwatch.reports.notice_savings`), likewise.
    notice_savings: dict[str, Any] | None = None
    # Issue 39's pictures (:mod:`fleetwatch.reports.week_pictures`): each node's state at the
    # week's end, and the fleet day by day over the weeks up to it.
    fleet_states: list[dict[str, Any]] | None = None
    days: list[dict[str, Any]] | None = None
    # Issue 40: the model's ranking at the week's start as drains (:mod:`.drain_curve`).
    drain_budget: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _drain_section(d: WeekData, catalog: XidCatalog) -> dict[str, Any]:
    """Drains performed, and confirmed ones: a failure or fatal event on the node within 24 h."""
    evidence: dict[int, list[datetime]] = defaultdict(list)
    for lt in d.lifetimes:
        if lt.end_kind == "failure" and lt.removed_at is not None and lt.node_id is not None:
            evidence[lt.node_id].append(lt.removed_at)
    for e in d.events:
        if e.kind == "xid":
            fatal = catalog.lookup(e.xid).severity == "fatal"
        else:  # a lost GPU, a host error at a severity that drains, a port down or flapping
            fatal = (
                e.kind == "gpu_lost"
                or is_urgent_host_event(e.kind, e.details)
                or is_urgent_port_event(e.kind, e.details)
            )
        if fatal and e.node_id is not None:
            evidence[e.node_id].append(e.ts)
    for times in evidence.values():
        times.sort()
    performed = drains(d)
    confirmed = 0
    by_kind: Counter[str] = Counter()
    for e in performed:
        node_id = d.node_ids.get(e.node)
        confirmed += node_id is not None and near(e.completed_at, evidence.get(node_id, []))
        by_kind[e.reason_kind] += 1
    total = len(performed)
    return {
        "performed": total,
        "confirmed": confirmed,
        "unconfirmed": total - confirmed,
        "false_drain_rate": (total - confirmed) / total if total else None,
        "by_reason_kind": dict(by_kind.most_common()),
    }


def _node_outages(d: WeekData, failed: list[Any]) -> int:
    """Drains performed plus GPU failures on nodes with no drain within 24 h of the failure."""
    drain_times: dict[int, list[datetime]] = defaultdict(list)
    for e in drains(d):
        if (node_id := d.node_ids.get(e.node)) is not None:
            drain_times[node_id].append(e.completed_at)
    for times in drain_times.values():
        times.sort()
    unplanned = sum(
        1
        for lt in failed
        if lt.node_id is None or not near(lt.removed_at, drain_times.get(lt.node_id, []))
    )
    return len(drains(d)) + unplanned


def _reliability(d: WeekData) -> dict[str, Any]:
    failed = failures(d)
    gpu_exposure = sum(
        overlap(lt.installed_at, lt.removed_at, d.start, d.end) for lt in d.lifetimes
    )
    replaced = replacements(d, failed)
    gpu_mtbf, gpu_mttr = mtbf_hours(gpu_exposure, len(failed)), mttr_hours(replaced)
    node_exposure = sum(
        overlap(n.first_seen, n.last_seen, d.start, d.end) for n in d.nodes.values()
    )
    outages = _node_outages(d, failed)
    returned = [
        (e.completed_at, e.returned_at)
        for e in d.evictions
        if not e.dry_run and e.completed_at is not None and within(e.returned_at, d.start, d.end)
    ]
    node_mtbf, node_mttr = mtbf_hours(node_exposure, outages), mttr_hours(returned)
    gpu = {
        "exposure_h": gpu_exposure,
        "failures": len(failed),
        "mtbf_h": gpu_mtbf,
        "mttr_h": gpu_mttr,
        "repairs": len(replaced),
        "availability": availability(gpu_mtbf, gpu_mttr),
    }
    node = {
        "exposure_h": node_exposure,
        "outages": outages,
        "mtbf_h": node_mtbf,
        "mttr_h": node_mttr,
        "repairs": len(returned),
        "repair_hours": [hours(a, b) for a, b in returned],
        "availability": availability(node_mtbf, node_mttr),
    }
    return {"gpu": gpu, "node": node}


def _interruptions(d: WeekData, catalog: XidCatalog) -> dict[str, Any]:
    xid_category: Counter[str] = Counter()
    for e in d.events:
        if e.kind == "xid" and within(e.ts, d.start, d.end):
            xid_category[catalog.lookup(e.xid).category] += 1
    component = Counter(lt.cause or "unknown" for lt in failures(d))
    reasons = Counter(
        e.reason_kind for e in d.evictions if not e.dry_run and within(e.created_at, d.start, d.end)
    )
    return {
        "by_component": interruptions_by_component(d.events, catalog, d.start, d.end),
        "xid_category": dict(xid_category.most_common()),
        "failure_component": dict(component.most_common()),
        "eviction_reason_kind": dict(reasons.most_common()),
    }


def _goodput(d: WeekData, settings: ServerSettings) -> dict[str, Any]:
    in_service = sum(overlap(lt.installed_at, lt.removed_at, d.start, d.end) for lt in d.lifetimes)
    slots = installs(d)
    lost_failures = 0.0
    for lt in d.lifetimes:
        removed = lt.removed_at
        if lt.end_kind == "failure" and removed is not None:
            if d.start - OPEN_SLOT_LIMIT <= removed < d.end:
                back = replaced_at(slots, lt, d.end) or removed + OPEN_SLOT_LIMIT
                lost_failures += overlap(
                    removed, min(back, removed + OPEN_SLOT_LIMIT), d.start, d.end
                )
    lost_drains = 0.0
    for e in d.evictions:
        if e.dry_run or e.completed_at is None:
            continue
        node_id = d.node_ids.get(e.node)
        n = d.gpus_per_node.get(node_id, 0) if node_id is not None else 0
        lost_drains += n * overlap(e.completed_at, e.returned_at, d.start, d.end)
    scheduled = in_service + lost_failures
    lost = lost_failures + lost_drains
    goodput = max(scheduled - lost, 0.0)
    return {
        "scheduled_gpu_h": scheduled,
        "in_service_gpu_h": in_service,
        "lost_to_failures_gpu_h": lost_failures,
        "lost_to_drains_gpu_h": lost_drains,
        "lost_gpu_h": lost,
        "goodput_gpu_h": goodput,
        "goodput_ratio": goodput / scheduled if scheduled else None,
        "usd_lost": lost * settings.gpu_hour_usd,
        "gpu_hour_usd": settings.gpu_hour_usd,
        "reporting_gpu_h": d.reporting_gpu_hours,
    }


def _energy(d: WeekData) -> dict[str, Any]:
    """Sum of energy counter increases (a decrease is a reset: count the new value); where a
    sample lacks the counter, the previous power reading times the gap."""
    total_mj, by_counter, by_power = 0.0, 0, 0
    prev: Any | None = None
    for s in d.samples:
        if prev is not None and prev.gpu_uuid == s.gpu_uuid:
            if s.energy_mj is not None and prev.energy_mj is not None:
                delta = s.energy_mj - prev.energy_mj
                total_mj += delta if delta >= 0 else s.energy_mj
                by_counter += 1
            elif prev.power_w is not None:
                total_mj += prev.power_w * (s.ts - prev.ts).total_seconds() * 1000.0
                by_power += 1
        prev = s
    return {
        "kwh": total_mj / 3.6e9,
        "method": "energy_mj counter increases; power_w x interval where the counter is missing",
        "intervals_from_counter": by_counter,
        "intervals_from_power": by_power,
    }


def _top(counter: Counter[str], extra: dict[str, float] | None = None) -> list[dict[str, Any]]:
    rows = []
    for key, count in counter.most_common(TOP):
        row: dict[str, Any] = {"key": key, "count": count}
        if extra is not None and extra.get(key):
            row["per_1000_gpu_h"] = 1000.0 * count / extra[key]
        rows.append(row)
    return rows


def _offenders(d: WeekData) -> dict[str, Any]:
    """Failures and drains by node and rack; failures (and rate) by SKU and driver."""
    node_name = {i: n.name for i, n in d.nodes.items()}
    rack = {n.name: str((n.labels or {}).get("rack", "unknown")) for n in d.nodes.values()}

    def driver_of(lt: Any) -> str:
        gpu = d.gpus.get(lt.gpu_uuid) if lt.gpu_uuid else None
        return (gpu.driver_version if gpu else None) or "unknown"

    by_node: Counter[str] = Counter()
    sku: Counter[str] = Counter()
    driver: Counter[str] = Counter()
    for lt in failures(d):
        by_node[node_name.get(lt.node_id, "unknown")] += 1
        sku[lt.sku or "unknown"] += 1
        driver[driver_of(lt)] += 1
    for e in drains(d):
        by_node[e.node] += 1
    by_rack: Counter[str] = Counter()
    for name, count in by_node.items():
        by_rack[rack.get(name, "unknown")] += count
    sku_h: dict[str, float] = defaultdict(float)
    driver_h: dict[str, float] = defaultdict(float)
    for lt in d.lifetimes:
        h = overlap(lt.installed_at, lt.removed_at, d.start, d.end)
        sku_h[lt.sku or "unknown"] += h
        driver_h[driver_of(lt)] += h
    return {
        "node": _top(by_node),
        "rack": _top(by_rack),
        "sku": _top(sku, sku_h),
        "driver": _top(driver, driver_h),
        "repeat": _repeat_offenders(d),
    }


def _repeat_offenders(d: WeekData) -> list[dict[str, Any]]:
    """Nodes evicted for hardware again within repeat_offender_days of a return, this week."""
    rows = [
        {
            "node": e.node,
            "eviction_id": e.id,
            "repeat_of": e.repeat_of,
            "evicted_at": e.created_at.isoformat(),
            "reason_kind": e.reason_kind,
        }
        for e in d.evictions
        if getattr(e, "repeat_of", None) is not None
        and not e.dry_run
        and within(e.created_at, d.start, d.end)
    ]
    return sorted(rows, key=lambda row: (row["evicted_at"], row["eviction_id"]))


def _stragglers(d: WeekData) -> dict[str, Any]:
    by_node = Counter(s.node for s in d.stragglers)
    worst = {s.node: 0.0 for s in d.stragglers}
    for s in d.stragglers:
        worst[s.node] = max(worst[s.node], s.ratio)
    return {
        "count": len(d.stragglers),
        "by_kind": dict(Counter(s.kind for s in d.stragglers)),
        "worst_nodes": [
            {"node": n, "count": c, "max_ratio": worst[n]} for n, c in by_node.most_common(TOP)
        ],
    }


@dataclass
class _Core:
    """The sections the headline is made of, computed once per week."""

    reliability: dict[str, Any]
    goodput: dict[str, Any]
    drains: dict[str, Any]
    energy: dict[str, Any]
    stragglers: int


def _core(d: WeekData, settings: ServerSettings, catalog: XidCatalog) -> _Core:
    return _Core(
        _reliability(d),
        _goodput(d, settings),
        _drain_section(d, catalog),
        _energy(d),
        len(d.stragglers),
    )


def headline(d: WeekData, settings: ServerSettings, catalog: XidCatalog) -> dict[str, Any]:
    """The week's figures that the report compares with the week before."""
    return _headline(_core(d, settings, catalog))


def _headline(c: _Core) -> dict[str, Any]:
    gpu, node = c.reliability["gpu"], c.reliability["node"]
    return {
        "gpu_mtbf_h": gpu["mtbf_h"],
        "gpu_mttr_h": gpu["mttr_h"],
        "gpu_availability": gpu["availability"],
        "node_mtbf_h": node["mtbf_h"],
        "node_mttr_h": node["mttr_h"],
        "node_availability": node["availability"],
        "gpu_failures": gpu["failures"],
        "node_outages": node["outages"],
        "drains": c.drains["performed"],
        "false_drain_rate": c.drains["false_drain_rate"],
        "goodput_ratio": c.goodput["goodput_ratio"],
        "gpu_hours_lost": c.goodput["lost_gpu_h"],
        "usd_lost": c.goodput["usd_lost"],
        "energy_kwh": c.energy["kwh"],
        "stragglers": c.stragglers,
    }


def _deltas(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key in HEADLINE:
        a, b = now.get(key), before.get(key)
        out[key] = {"previous": b, "delta": a - b if a is not None and b is not None else None}
    return out


def _sla(rel: dict[str, Any], settings: ServerSettings) -> dict[str, Any]:
    node = rel["node"]
    repairs = node["repair_hours"]
    within_target = [h for h in repairs if h <= settings.sla_mttr_h]
    a, mttr = node["availability"], node["mttr_h"]
    return {
        "availability_target": settings.sla_availability,
        "availability": a,
        "availability_met": None if a is None else a >= settings.sla_availability,
        "mttr_target_h": settings.sla_mttr_h,
        "mttr_h": mttr,
        "mttr_met": None if mttr is None else mttr <= settings.sla_mttr_h,
        "repairs_within_target": len(within_target) / len(repairs) if repairs else None,
    }


def build_weekly(
    d: WeekData,
    before: WeekData,
    *,
    settings: ServerSettings,
    catalog: XidCatalog | None = None,
    now: datetime | None = None,
    availability: dict[str, Any] | None = None,
    notice_savings: dict[str, Any] | None = None,
    fleet_states: list[dict[str, Any]] | None = None,
    days: list[dict[str, Any]] | None = None,
) -> WeeklyReport:
    """The report for the week of ``d``, compared with ``before`` (the week before); lifetimes
    still open at ``now`` are censored there (KM). ``availability``: the week's
    :func:`~fleetwatch.reports.availability.compute_availability` figures, shown as they are;
    ``notice_savings``: the week's :func:`~fleetwatch.reports.notice_savings.notice_savings`."""
    catalog = catalog or XidCatalog.load()
    now = now or datetime.now(UTC)
    core = _core(d, settings, catalog)
    head = _headline(core)
    return WeeklyReport(
        week=str(d.week),
        start=d.start.isoformat(),
        end=d.end.isoformat(),
        generated_at=now.isoformat(),
        headline=head,
        reliability=core.reliability,
        interruptions=_interruptions(d, catalog),
        goodput=core.goodput,
        energy=core.energy,
        drains=core.drains,
        calibration=calibration(
            d.model, d.lifetimes, d.start, d.end, d.features, settings.location_pattern
        ),
        offenders=_offenders(d),
        survival=km_by_sku(d.lifetimes, min(now, d.end)),
        stragglers=_stragglers(d),
        deltas=_deltas(head, headline(before, settings, catalog)),
        sla=_sla(core.reliability, settings),
        availability=availability,
        notice_savings=notice_savings,
        fleet_states=fleet_states,
        days=days,
        drain_budget=drain_curve(
            d.model, d.lifetimes, d.start, d.features, settings.location_pattern
        ),
    )
