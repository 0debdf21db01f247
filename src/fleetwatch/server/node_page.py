"""A page per node at ``/nodes/<name>``, linked from the fleet map and every table of the fleet
page: its GPUs with their newest readings, risk and verdicts (with the evidence the rules
recorded), its recent events, evictions, validations, maintenance windows, and its availability
over the fleet page's trend days. Same sign-in as the fleet page (a ``?token=`` moves to the
cookie and comes back here), the same Content-Security-Policy, no script.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup

from fleetwatch.charts import availability_svg, events_svg
from fleetwatch.charts.fleet_map import FILL, WORDS, node_href
from fleetwatch.config import ServerSettings
from fleetwatch.errors import AuthError, NotFound
from fleetwatch.reports.availability import SlaTargets, compute_availability
from fleetwatch.reports.daily import daily_figures, day_starts
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.db.session import Database
from fleetwatch.server.fleet_pictures import TREND_DAYS, node_flags, node_state
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.page import (
    authenticate,
    bearer_token,
    html,
    sign_in_form,
    signed_in,
    templates,
)
from fleetwatch.server.repo.availability_rows import load_outages
from fleetwatch.server.repo.events import list_events
from fleetwatch.server.repo.evictions import list_evictions
from fleetwatch.server.repo.fleet_page import draining_nodes
from fleetwatch.server.repo.maintenance import list_windows
from fleetwatch.server.repo.nodes import get_node
from fleetwatch.server.repo.validations import list_validations

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

_EVENT_DAYS = 7
_LIMIT = 100
_HORIZON_DAYS = 1.0  # the fleet page's default horizon


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    name: str | None
    serial: str | None
    latest_ts: datetime | None
    readings: list[tuple[str, Any]]
    probability: float | None
    basis: str
    verdicts: list[dict[str, Any]]
    factors: list[tuple[str, float | None, str]]
    """The model's strongest drivers of this GPU's risk: (name, its reading, ratio), a ratio
    above 1 raising the risk; empty where the model did not score it."""
    noticed: bool
    """Its model risk is at or above the notice threshold: the factors are what a job was told."""


@dataclass(frozen=True)
class NodeView:
    now: datetime
    node: dict[str, Any]
    state: str
    state_words: str
    fill: str
    gpus: list[GpuRow]
    events: list[dict[str, Any]]
    event_days: int
    evictions: list[Any]
    validations: list[Any]
    windows: list[Any]
    availability: dict[str, Any]
    events_svg: Markup
    availability_svg: Markup
    trend_days: int


@router.get("/nodes/{name}", response_class=HTMLResponse, summary="A node's page")
async def node_page(
    request: Request,
    name: str,
    token: Annotated[str | None, Query(description="a read token, moved to a cookie")] = None,
) -> Response:
    try:
        info = await authenticate(request, token)
    except AuthError as exc:
        return sign_in_form(request, exc, presented=token or bearer_token(request))
    if token is not None:
        return signed_in(request, token, info, path=node_href(name))
    try:
        view = await run_in_threadpool(_build, request, name)
    except NotFound:
        body = templates().get_template("node.html").render(view=None, name=name)
        return html(body, 404)
    return html(templates().get_template("node.html").render(view=view, name=name))


def _build(request: Request, name: str) -> NodeView:
    db: Database = request.app.state.db
    settings: ServerSettings = request.app.state.settings
    liveness: Liveness = request.app.state.liveness
    assessor: Assessor = request.app.state.assessor
    snap = assessor.current()
    now = liveness.clock()
    starts = day_starts(now, TREND_DAYS)
    with db.read() as conn:
        node = get_node(conn, name=name, now=now, liveness=liveness)
        events = list_events(conn, node=name, since=now - timedelta(days=_EVENT_DAYS), limit=_LIMIT)
        evictions = list_evictions(conn, node=name, limit=_LIMIT)
        validations = list_validations(conn, name, limit=20)
        windows = list_windows(conn, now=now, node=name, limit=20)
        draining = draining_nodes(conn)
        period = load_outages(conn, starts[0], now)
    mine = {name} & set(period.nodes)
    period.nodes = {n: {} for n in mine}
    period.outages = [o for o in period.outages if o.node == name]
    days = daily_figures(period, starts)
    figures = compute_availability(
        period, SlaTargets(settings.sla_availability, settings.sla_recovery_minutes), by=()
    )["fleet"]
    flags = node_flags(snap, _HORIZON_DAYS, settings.notice_risk_threshold)
    state = node_state(name, node["state"], flags, draining)
    risks = {r.gpu.uuid: r for r in snap.node_risks(_HORIZON_DAYS).get(name, (None, []))[1]}
    return NodeView(
        now=now,
        node=node,
        state=state,
        state_words=WORDS[state],
        fill=FILL[state],
        gpus=[
            _gpu_row(g, risks.get(g["uuid"]), settings.notice_risk_threshold) for g in node["gpus"]
        ],
        events=events,
        event_days=_EVENT_DAYS,
        evictions=evictions,
        validations=validations,
        windows=windows,
        availability=figures,
        events_svg=Markup(events_svg(days)),
        availability_svg=Markup(availability_svg(days, target=settings.sla_availability)),
        trend_days=TREND_DAYS,
    )


def _gpu_row(gpu: dict[str, Any], risk: Any, notice_threshold: float) -> GpuRow:
    latest = gpu["latest"] or {}
    verdicts = []
    if risk is not None:
        for v in risk.gpu.verdicts:
            verdicts.append(
                {
                    "rule": v.rule,
                    "severity": v.severity,
                    "action": v.action,
                    "out": v.takes_gpu_out,
                    "xids": v.xids,
                    "note": v.note,
                    "first_seen": v.first_seen,
                    "last_seen": v.last_seen,
                    "evidence": sorted(v.evidence.items()),
                }
            )
    return GpuRow(
        index=gpu["index"],
        uuid=gpu["uuid"],
        name=gpu["name"],
        serial=gpu["serial"],
        latest_ts=latest.get("ts"),
        readings=sorted((latest.get("values") or {}).items()),
        probability=risk.probability if risk is not None else None,
        basis=risk.basis if risk is not None else "none",
        verdicts=verdicts,
        factors=[(f.name, f.value, f.effect) for f in risk.factors] if risk else [],
        noticed=risk is not None
        and risk.model_probability is not None
        and risk.model_probability >= notice_threshold,
    )
