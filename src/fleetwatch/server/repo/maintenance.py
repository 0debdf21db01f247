"""Maintenance windows in the database: opening, ending and listing them, and what they mean now.

Windows live in ``maintenance_windows``, so every server process and replica reads the same
ones: :func:`load_planned` is what the liveness readers, the planner, the alerter and the
lifecycle job consult at each pass (``server.concepts.planned`` says what a window changes).

Ending (``DELETE /v1/maintenance/{id}``, or an adapter whose reservation went away) sets
``ended_at`` and ``ended_by`` and deletes nothing: a window ended before it began is
``cancelled`` and never took effect, one ended early stops covering its nodes then. The row is
the audit trail: who opened it, when, why; who ended it, when.

:func:`maintenance_intervals` gives each node's planned intervals within a period, for the
downtime figures (planned versus unplanned). A selector window's nodes are those whose labels
match it now: a node relabelled since is judged by its labels today.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Row, and_, insert, or_, select, update

from fleetwatch.errors import Conflict, InvalidInput, NotFound
from fleetwatch.server.concepts.planned import (
    Planned,
    WindowRow,
    WindowState,
    effective_end,
    parse_selector,
    window_nodes,
)
from fleetwatch.server.db.tables import maintenance_windows, nodes

__all__ = [
    "Window",
    "WindowRequest",
    "create_window",
    "end_window",
    "get_window",
    "list_windows",
    "load_planned",
    "maintenance_intervals",
    "nodes_in_maintenance",
    "windows_since",
]

logger = logging.getLogger(__name__)

mw = maintenance_windows.c
# An ended window still matters for this long: silence counts from its end (concepts.planned).
# Past it, judging from the node's last report gives the same answer for any node whose
# unreachable deadline (a few intervals) is shorter.
ENDED_LOOKBACK = timedelta(days=1)
_FAR = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


class WindowRequest(Protocol):
    """What opens a window (the API's ``MaintenanceCreate``)."""

    @property
    def nodes(self) -> list[str] | None: ...
    @property
    def selector(self) -> str | None: ...
    @property
    def starts_at(self) -> datetime | None: ...
    @property
    def ends_at(self) -> datetime | None: ...
    @property
    def reason(self) -> str: ...
    @property
    def key(self) -> str | None: ...


@dataclass(frozen=True)
class Window:
    """A stored window with its state at a given now and the nodes it covers then."""

    id: int
    state: WindowState
    nodes: list[str] | None
    selector: dict[str, str] | None
    covered: list[str]
    starts_at: datetime
    ends_at: datetime | None
    reason: str
    key: str | None
    created_by: str
    created_at: datetime
    ended_at: datetime | None
    ended_by: str | None


def _state(row: Any, now: datetime) -> WindowState:
    end = effective_end(row.ends_at, row.ended_at)
    if end is not None and end <= row.starts_at:
        return "cancelled"
    if end is not None and end <= now:
        return "ended"
    return "upcoming" if row.starts_at > now else "active"


def _labels(conn: Connection) -> dict[str, dict[str, Any]]:
    rows = conn.execute(select(nodes.c.name, nodes.c.labels))
    return {row.name: row.labels or {} for row in rows}


def _window(row: Any, now: datetime, labels: dict[str, dict[str, Any]] | None) -> Window:
    covered = window_nodes(WindowRow.from_row(row), labels or {})
    return Window(
        id=row.id,
        state=_state(row, now),
        nodes=row.nodes,
        selector=row.selector,
        covered=sorted(covered),
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        reason=row.reason,
        key=row.key,
        created_by=row.created_by,
        created_at=row.created_at,
        ended_at=row.ended_at,
        ended_by=row.ended_by,
    )


def _open(now: datetime) -> Any:
    """Windows that have not ended by ``now`` (begun or not)."""
    return and_(
        mw.ended_at.is_(None),
        or_(mw.ends_at.is_(None), mw.ends_at > now),
    )


def create_window(conn: Connection, body: WindowRequest, *, actor: str, now: datetime) -> Window:
    """Open a window; InvalidInput naming the field, or Conflict for a key already open."""
    if (body.nodes is None) == (body.selector is None):
        raise InvalidInput(
            "name the nodes or give a selector, not both and not neither",
            [{"loc": ["body", "nodes"], "msg": "give exactly one of nodes and selector"}],
        )
    starts_at = body.starts_at or now
    if body.ends_at is not None and body.ends_at <= starts_at:
        raise InvalidInput(
            "ends_at must be after starts_at",
            [
                {
                    "loc": ["body", "ends_at"],
                    "msg": f"must be after starts_at ({starts_at.isoformat()})",
                }
            ],
        )
    if body.key is not None:
        held = conn.execute(select(mw.id).where(mw.key == body.key, _open(now)).limit(1)).scalar()
        if held is not None:
            raise Conflict(f"window {held} with key {body.key!r} is still open; end it first")
    selector = parse_selector(body.selector) if body.selector is not None else None
    names = sorted(set(body.nodes)) if body.nodes is not None else None
    window_id = conn.execute(
        insert(maintenance_windows)
        .values(
            nodes=names,
            selector=selector,
            starts_at=starts_at,
            ends_at=body.ends_at,
            reason=body.reason,
            key=body.key,
            created_by=actor,
            created_at=now,
        )
        .returning(mw.id)
    ).scalar_one()
    logger.info(
        "maintenance window %d opened by %s: %s from %s to %s (%s)",
        window_id,
        actor,
        names if names is not None else body.selector,
        starts_at.isoformat(),
        body.ends_at.isoformat() if body.ends_at else "until ended",
        body.reason,
    )
    return get_window(conn, int(window_id), now=now)


def _row(conn: Connection, window_id: int) -> Row[Any]:
    row = conn.execute(select(maintenance_windows).where(mw.id == window_id)).first()
    if row is None:
        raise NotFound("maintenance window", str(window_id))
    return row


def get_window(conn: Connection, window_id: int, *, now: datetime) -> Window:
    row = _row(conn, window_id)
    return _window(row, now, _labels(conn) if row.selector is not None else None)


def list_windows(
    conn: Connection,
    *,
    now: datetime,
    states: Iterable[str] | None = None,
    node: str | None = None,
    key_prefix: str | None = None,
    limit: int = 1000,
) -> list[Window]:
    """Newest first; ``node`` keeps the windows that cover it (by name or by its labels)."""
    query = select(maintenance_windows).order_by(mw.id.desc())
    if key_prefix is not None:
        query = query.where(mw.key.startswith(key_prefix, autoescape=True))
    wanted = set(states) if states else None
    if wanted is not None and not wanted & {"ended", "cancelled"}:
        query = query.where(_open(now))  # what adapters poll: not the whole history
    rows = list(conn.execute(query))
    labels = _labels(conn) if any(r.selector is not None for r in rows) else None
    found = []
    for row in rows:
        window = _window(row, now, labels)
        if wanted is not None and window.state not in wanted:
            continue
        if node is not None and node not in window.covered:
            continue
        found.append(window)
        if len(found) >= limit:
            break
    return found


def end_window(conn: Connection, window_id: int, *, actor: str, now: datetime) -> Window:
    """End a window now (cancel it, if it has not begun); Conflict if it has ended already."""
    row = _row(conn, window_id)
    if _state(row, now) in ("ended", "cancelled"):
        raise Conflict(f"maintenance window {window_id} has ended already", _state(row, now))
    # Conditional: two callers ending it at once leave one ender.
    done = conn.execute(
        update(maintenance_windows)
        .where(mw.id == window_id, mw.ended_at.is_(None))
        .values(ended_at=now, ended_by=actor)
    )
    if done.rowcount != 1:
        raise Conflict(f"maintenance window {window_id} has ended already", "ended")
    logger.info("maintenance window %d ended by %s", window_id, actor)
    return get_window(conn, window_id, now=now)


def _rows_for(conn: Connection, since: datetime, until: datetime) -> list[WindowRow]:
    """Windows that may cover some instant in [since, until]."""
    query = select(maintenance_windows).where(
        mw.starts_at <= until,
        or_(mw.ends_at.is_(None), mw.ends_at > since),
        or_(mw.ended_at.is_(None), mw.ended_at > since),
    )
    return [WindowRow.from_row(row) for row in conn.execute(query)]


def windows_since(
    conn: Connection, since: datetime
) -> tuple[list[WindowRow], dict[str, dict[str, Any]]]:
    """Every window not over by ``since`` (begun or not), and the node labels when a selector
    window is among them (else none): what :meth:`Planned.build` needs for any later now."""
    windows = _rows_for(conn, since, _FAR)
    labels = _labels(conn) if any(w.selector is not None for w in windows) else {}
    return windows, labels


def load_planned(
    conn: Connection, now: datetime, *, lookback: timedelta = ENDED_LOOKBACK
) -> Planned:
    """Which nodes are in maintenance at ``now``, and the recent window ends (one small query;
    the node labels too only when a selector window is among them)."""
    windows = _rows_for(conn, now - lookback, now)
    if not windows:
        return Planned()
    labels = _labels(conn) if any(w.selector is not None for w in windows) else {}
    return Planned.build(windows, labels, now)


def nodes_in_maintenance(conn: Connection, now: datetime) -> set[str]:
    """The names of the nodes a window covers at ``now``."""
    return set(load_planned(conn, now).active)


def maintenance_intervals(
    conn: Connection, since: datetime, until: datetime
) -> dict[str, list[tuple[datetime, datetime]]]:
    """Per node, its planned intervals within [since, until], clipped to it (a window still open
    ends at ``until``), sorted and with overlaps merged."""
    windows = _rows_for(conn, since, until)
    labels = _labels(conn) if any(w.selector is not None for w in windows) else {}
    spans: dict[str, list[tuple[datetime, datetime]]] = {}
    for w in windows:
        end = effective_end(w.ends_at, w.ended_at)
        start, stop = max(w.starts_at, since), min(end or until, until)
        if stop <= start:
            continue
        for node in window_nodes(w, labels):
            spans.setdefault(node, []).append((start, stop))
    return {node: _merged(found) for node, found in spans.items()}


def _merged(spans: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for start, stop in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out
