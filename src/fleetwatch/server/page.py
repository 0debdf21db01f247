"""The built-in fleet page at ``/``: one server-rendered HTML page, no JavaScript.

It shows what an on-call engineer looks at first: nodes up and unreachable by rack (and those not
heard from since the server started, judged as ``/v1/nodes`` and the alerter judge), the riskiest
GPUs (ranked as ``GET /v1/risk`` ranks them), fatal Xids of the last day, evictions waiting for a
scheduler or a person, and active stragglers.

Browsers cannot send a bearer header on a plain page load, so the page also reads a session from
the ``fleetwatch_session`` cookie (HttpOnly, SameSite=Strict, 12 h). ``/?token=<read token>``
checks the token, sets the cookie and redirects to ``/``, so the token leaves the address bar; the
sign-in form posts to ``/signin`` and does the same. The cookie never holds the token: it holds
the token's id, an expiry and a MAC keyed by the token's stored hash
(:func:`fleetwatch.server.auth.page_session`), checked against the token on every load, so
revocation ends a session at once. The token check is the API's own
(:func:`fleetwatch.server.deps.require`), so scopes, revocation and ``--insecure-no-auth`` behave
exactly as they do for ``/v1``. Every value reaches the HTML through Jinja2's autoescaping.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlencode

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from markupsafe import Markup
from sqlalchemy import Connection

from fleetwatch.charts.fleet_map import node_href
from fleetwatch.config import ServerSettings
from fleetwatch.errors import AuthError, Forbidden, Unauthenticated
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.auth import (
    SESSION_TTL,
    Permission,
    TokenInfo,
    authenticate_session,
    check_permission,
    page_session,
)
from fleetwatch.server.concepts.ingest_lag import fleet_lag_s
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.csp import PAGE_HEADERS
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import check_credentials
from fleetwatch.server.fleet_pictures import FleetPictures, draw, node_flags
from fleetwatch.server.judge.assessment import FleetAssessment, GpuRisk, risk_order
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.repo.fleet_page import (
    active_stragglers,
    draining_nodes,
    fatal_xid_events,
    gpu_count,
    node_clocks,
    waiting_evictions,
)
from fleetwatch.server.repo.maintenance import load_planned

__all__ = [
    "COOKIE",
    "authenticate",
    "authenticate_page",
    "bearer_token",
    "html",
    "router",
    "sign_in_form",
    "signed_in",
    "templates",
]

COOKIE = "fleetwatch_session"
_LEGACY_COOKIE = "fleetwatch_token"  # held the raw token before sessions: deleted on sight
_COOKIE_MAX_AGE_S = int(SESSION_TTL.total_seconds())
_MAX_FORM_BYTES = 4096
_REFRESH_S = 60
_HORIZON_DAYS = {"24h": 1.0, "7d": 7.0, "30d": 30.0}
_FATAL = ("critical", "fatal")
_LIST_LIMIT = 100
_WEEKLY_REPORT = "/v1/reports/weekly"
_HEADERS = PAGE_HEADERS

router = APIRouter(include_in_schema=False)


def _utc(when: datetime | None) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if when else ""


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    seconds = max(0.0, (now - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _node_link(name: str | None) -> Markup:
    """``name`` as a link to its node page (nothing for no node)."""
    if not name:
        return Markup("")
    return Markup('<a class="node" href="{}">{}</a>').format(node_href(name), name)


def templates() -> jinja2.Environment:
    """The server's page templates (the fleet page's and the node page's)."""
    return _templates()


@functools.cache
def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fleetwatch.server", "templates"),
        autoescape=True,  # every template here is HTML
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["utc"] = _utc
    env.filters["ago"] = _ago
    env.filters["node_link"] = _node_link
    return env


def _bearer_token(request: Request) -> str | None:
    """The bearer header's token (curl, scripts)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def authenticate_page(request: Request, token: str | None) -> TokenInfo:
    """The token's info if it may read the fleet; raises :class:`AuthError` otherwise.

    The same check as the API's ``ReadAuth`` (which also honours ``--insecure-no-auth``), fed from
    the cookie instead of the Authorization header.
    """
    credentials = (
        HTTPAuthorizationCredentials(scheme="Bearer", credentials=token) if token else None
    )
    db: Database = request.app.state.db
    settings: ServerSettings = request.app.state.settings
    return check_credentials(db, settings, credentials, Permission.READ)


def authenticate_cookie(request: Request, session: str | None) -> TokenInfo:
    """The token behind the page's session cookie if it may read the fleet; raises
    :class:`AuthError` otherwise. ``--insecure-no-auth`` lets anyone in, as for the API."""
    settings: ServerSettings = request.app.state.settings
    if settings.insecure_no_auth or not session:
        return authenticate_page(request, None)  # admin without auth, else "missing token"
    db: Database = request.app.state.db
    with db.read() as conn:
        info = authenticate_session(conn, session, now=utcnow())
    check_permission(info.scope, Permission.READ)
    return info


async def _authenticate(request: Request, token: str | None) -> TokenInfo:
    """A token given in the query or the form, else the bearer header's, else the cookie's
    session; raises :class:`AuthError`."""
    token = token if token is not None else _bearer_token(request)
    if token is not None:
        return await run_in_threadpool(authenticate_page, request, token)
    return await run_in_threadpool(authenticate_cookie, request, request.cookies.get(COOKIE))


def _html(body: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status_code, headers=_HEADERS)


def _sign_in(request: Request, error: AuthError, *, presented: str | None) -> HTMLResponse:
    """The sign-in form: 403 for a token that may not read, 401 for none or a bad one.
    ``presented``: the token given in the query, form or header; None when only the cookie was."""
    status, message = 401, None
    from_cookie = presented is None and request.cookies.get(COOKIE) is not None
    if isinstance(error, Forbidden):
        status, message = 403, f"A {error.scope!r} token cannot read the fleet; use a read token."
    elif presented is not None:
        message = "That token was not accepted (unknown, malformed or revoked)."
    elif from_cookie and isinstance(error, Unauthenticated):
        message = "Your session ended (expired, or its token was revoked); sign in again."
    body = _templates().get_template("fleet.html").render(signin=True, message=message, view=None)
    response = _html(body, status)
    if from_cookie:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    _drop_legacy_cookie(request, response)
    return response


def _drop_legacy_cookie(request: Request, response: Response) -> None:
    if _LEGACY_COOKIE in request.cookies:
        response.delete_cookie(_LEGACY_COOKIE, path="/", httponly=True, samesite="strict")


def _signed_in(request: Request, token: str, info: TokenInfo, path: str = "/") -> RedirectResponse:
    """303 to the page (``path``) without the token in its address; a session for it goes to
    the cookie."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    url = f"{path}?{urlencode(kept)}" if kept else path
    response = RedirectResponse(url, status_code=303, headers=_HEADERS)
    _drop_legacy_cookie(request, response)
    if request.app.state.settings.insecure_no_auth:
        return response  # any token passes: there is nothing worth keeping
    response.set_cookie(
        COOKIE,
        page_session(token, info.token_id, now=utcnow()),
        max_age=_COOKIE_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/", response_class=HTMLResponse, summary="The fleet page")
async def fleet_page(
    request: Request,
    token: Annotated[str | None, Query(description="a read token, moved to a cookie")] = None,
    horizon: Literal["24h", "7d", "30d"] = "24h",
    top: Annotated[int, Query(ge=1, le=500)] = 20,
) -> Response:
    try:
        info = await _authenticate(request, token)
    except AuthError as exc:
        return _sign_in(request, exc, presented=token or _bearer_token(request))
    if token is not None:
        return _signed_in(request, token, info)
    view = await run_in_threadpool(_build_view, request, horizon, top)
    body = (
        _templates()
        .get_template("fleet.html")
        .render(signin=False, message=None, view=view, refresh_s=_REFRESH_S)
    )
    return _html(body)


@router.get("/report", response_class=HTMLResponse, summary="The weekly report, for browsers")
async def weekly_report_page(
    request: Request,
    week: Annotated[str | None, Query(description="ISO week, e.g. 2026-W48")] = None,
) -> Response:
    """The weekly report in HTML behind the page's cookie (a browser cannot send the bearer
    header that ``GET /v1/reports/weekly`` wants)."""
    from fleetwatch.server.routers.reports import weekly_report_response

    try:
        await _authenticate(request, None)
    except AuthError as exc:
        return _sign_in(request, exc, presented=_bearer_token(request))
    return await weekly_report_response(
        request.app.state.db, request.app.state.settings, week, "html"
    )


@router.post("/signin", response_class=HTMLResponse, summary="Sign in to the fleet page")
async def sign_in(request: Request) -> Response:
    """Form post (``token=...``): a valid read token becomes the page cookie."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_FORM_BYTES:
            break  # a token is under 100 bytes; whatever this is, it is not one
    token = _form_token(raw[:_MAX_FORM_BYTES])
    try:
        info = await run_in_threadpool(authenticate_page, request, token)
    except AuthError as exc:
        return _sign_in(request, exc, presented=token)
    if token is None:  # --insecure-no-auth: nothing to keep
        return RedirectResponse("/", status_code=303, headers=_HEADERS)
    return _signed_in(request, token, info)


def _form_token(raw: bytes) -> str | None:
    """The ``token`` field of an urlencoded form; None when absent or unreadable."""
    try:
        fields = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:
        return None
    return (fields.get("token") or [""])[0].strip() or None


# -- what the page shows ----------------------------------------------------------------------


@dataclass(frozen=True)
class RackRow:
    rack: str
    up: list[str]
    unreachable: list[str]
    unheard: list[str]
    maintenance: list[tuple[str, str]]  # (name, "window 7: reason")


@dataclass(frozen=True)
class RiskRow:
    probability: float | None
    basis: str
    node: str
    index: int
    uuid: str
    sku: str | None
    reason: str


@dataclass(frozen=True)
class FleetView:
    now: datetime
    assessed_at: datetime
    model_version: int | None
    horizon: str
    racks: list[RackRow]
    nodes_up: int
    nodes_unreachable: int
    nodes_unheard: int
    nodes_maintenance: int
    gpu_count: int
    gpus_out: int
    risks: list[RiskRow]
    risk_total: int
    no_model: bool
    pictures: FleetPictures
    fatal_events: list[dict[str, Any]]
    evictions: list[dict[str, Any]]
    stragglers: list[dict[str, Any]]
    weekly_report: str | None


def _build_view(request: Request, horizon: str, top: int) -> FleetView:
    db: Database = request.app.state.db
    assessor: Assessor = request.app.state.assessor
    snap = assessor.current()
    liveness: Liveness = request.app.state.liveness
    now = liveness.clock()
    settings: ServerSettings = request.app.state.settings
    flags = node_flags(snap, _HORIZON_DAYS[horizon], settings.notice_risk_threshold)
    with db.read() as conn:
        racks, readings = _racks(conn, now, liveness)
        gpus = gpu_count(conn)
        fatal = _fatal_events(conn, assessor.judge.catalog, now - timedelta(hours=24))
        waiting = waiting_evictions(conn, limit=_LIST_LIMIT)
        slow = active_stragglers(conn, limit=_LIST_LIMIT)
        pictures = draw(
            conn,
            readings,
            flags=flags,
            draining=draining_nodes(conn),
            now=now,
            sla_target=settings.sla_availability,
        )
    # GPUs with something to say: a verdict or a model's probability (not one row per GPU
    # saying that no model is fitted).
    risks = [
        r for r in _ranked(snap, _HORIZON_DAYS[horizon]) if r.basis != "none" or r.gpu.verdicts
    ]
    return FleetView(
        now=now,
        assessed_at=snap.at,
        model_version=snap.model_version,
        horizon=horizon,
        racks=racks,
        nodes_up=sum(len(r.up) for r in racks),
        nodes_unreachable=sum(len(r.unreachable) for r in racks),
        nodes_unheard=sum(len(r.unheard) for r in racks),
        nodes_maintenance=sum(len(r.maintenance) for r in racks),
        gpu_count=gpus,
        gpus_out=flags.out_gpus,
        risks=[_risk_row(r) for r in risks[:top]],
        risk_total=len(risks),
        no_model=snap.bundle is None,
        pictures=pictures,
        fatal_events=fatal,
        evictions=waiting,
        stragglers=slow,
        weekly_report=_weekly_report_link(request),
    )


def _racks(
    conn: Connection, now: datetime, liveness: Liveness
) -> tuple[list[RackRow], list[tuple[str, Mapping[str, Any], str]]]:
    """The rack table's rows, and each node's (name, labels, liveness reading) for the map."""
    grouped: dict[str, RackRow] = {}
    readings: list[tuple[str, Mapping[str, Any], str]] = []
    planned = load_planned(conn, now)
    rows = node_clocks(conn)
    lag = fleet_lag_s(((r.last_seen, r.lag_s) for r in rows), now, max_s=liveness.lag_max_s)
    for row in rows:
        labels: Mapping[str, Any] = row.labels or {}
        rack = str(labels.get("rack") or "(no rack label)")
        entry = grouped.setdefault(
            rack, RackRow(rack=rack, up=[], unreachable=[], unheard=[], maintenance=[])
        )
        state = liveness.state(
            row.last_seen, row.interval_s, now, planned=planned, node=row.name, lag_s=lag
        )
        readings.append((row.name, labels, state))
        window = planned.window(row.name)
        if window is not None:
            entry.maintenance.append((row.name, f"window {window.id}: {window.reason}"))
            continue
        by_state = {"up": entry.up, "unheard": entry.unheard, "unreachable": entry.unreachable}
        by_state[state].append(row.name)
    # Racks with unreachable nodes first: that is where to look.
    return sorted(grouped.values(), key=lambda r: (-len(r.unreachable), r.rack)), readings


def _ranked(snap: FleetAssessment, horizon_days: float) -> list[GpuRisk]:
    return sorted(snap.risks(horizon_days), key=risk_order)  # as GET /v1/risk ranks


def _risk_row(risk: GpuRisk) -> RiskRow:
    return RiskRow(
        probability=risk.probability,
        basis=risk.basis,
        node=risk.gpu.node,
        index=risk.gpu.index,
        uuid=risk.gpu.uuid,
        sku=risk.gpu.sku,
        reason=_reason(risk),
    )


def _reason(risk: GpuRisk) -> str:
    if risk.basis == "rule":
        parts = []
        for v in risk.gpu.verdicts:
            if not v.takes_gpu_out:
                continue
            xids = f" Xid {', '.join(str(x) for x in v.xids)}" if v.xids else ""
            note = f": {v.note}" if v.note else ""
            parts.append(f"{v.rule} ({v.severity}, {v.action}){xids}{note}")
        return "; ".join(parts)
    if risk.basis == "model":
        top = sorted(risk.factors, key=lambda f: -f.strength)[:3]
        drivers = ", ".join(f"{f.name} {f.effect}" for f in top)
        return f"model {risk.model or ''}: {drivers}".strip(": ") if drivers else "model"
    return "; ".join(f"{v.rule} ({v.severity}, {v.action})" for v in risk.gpu.verdicts)


def _fatal_events(conn: Connection, catalog: XidCatalog, since: datetime) -> list[dict[str, Any]]:
    codes = {entry.xid: entry for entry in catalog if entry.severity in _FATAL}
    if not codes:
        return []
    out = []
    for row in fatal_xid_events(conn, codes, since=since, limit=_LIST_LIMIT):
        entry = codes[row.xid]
        out.append({**row._asdict(), "mnemonic": entry.mnemonic, "severity": entry.severity})
    return out


def _weekly_report_link(request: Request) -> str | None:
    """The weekly report page (cookie-authenticated) when this server has the report route."""
    paths: Sequence[str] = [getattr(route, "path", "") for route in request.app.routes]
    return "/report" if _WEEKLY_REPORT in paths else None


# The fleet page's sign-in, shared with the node pages (server.node_page).
authenticate = _authenticate
bearer_token = _bearer_token
html = _html
sign_in_form = _sign_in
signed_in = _signed_in
