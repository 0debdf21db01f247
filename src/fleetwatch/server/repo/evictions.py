"""Evictions and their audit trail: reads, and every state change, each one audited.

States and who moves them::

    planner:    (new) -> pending | paged | recommended;  pending | paged | recommended -> cancelled
                acked (lease expired) -> pending
    scheduler:  pending -> acked -> completed -> returned;  pending | acked | paged | recommended
                -> rejected

A change is a conditional ``UPDATE ... WHERE state = <the state read>`` (plus the claim condition
for an ack) whose row count says whether it won: two schedulers acking at once, on PostgreSQL
too, leave exactly one claimer. The loser reads the row again and gets a 409 naming its state.

Every creation and change also sends ``NOTIFY fleetwatch_evictions`` on PostgreSQL, in the same
transaction, so it is delivered on commit: long-polls of ``GET /v1/evictions`` on every replica
wake at once (``server/act/eviction_watch.py``).

Every state change also writes one ``eviction_audit`` row, so the newest audit id is a change
cursor: ``eviction_cursor`` reads it, and ``list_evictions(changed_after=c)`` lists only the
evictions changed since. Ids are handed out at insert and two transactions may commit in the other
order, so a cursor read between those commits can pass over the earlier one: a cursor is a way to
hear of changes sooner, never the only way to find them.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, and_, func, insert, or_, select, text, update

from fleetwatch.errors import Conflict, NotFound
from fleetwatch.server.db.tables import eviction_audit, evictions
from fleetwatch.server.repo.validations import return_blocker

__all__ = [
    "DRAINING_STATES",
    "OPEN_STATES",
    "ack_eviction",
    "approve_eviction",
    "cancel_eviction",
    "complete_eviction",
    "cooling_nodes",
    "create_eviction",
    "eviction_cursor",
    "expire_leases",
    "get_eviction",
    "last_returns",
    "list_evictions",
    "open_evictions",
    "reject_eviction",
    "return_node",
]

# Count against the fleet drain budget: the node is, or is about to be, out of service.
DRAINING_STATES = ("pending", "acked", "completed")
# A node with one of these is not given another eviction.
OPEN_STATES = (*DRAINING_STATES, "paged", "recommended")
_CANCELLABLE = ("pending", "paged", "recommended")
_REJECTABLE = ("pending", "acked", "paged", "recommended")


def eviction_cursor(conn: Connection) -> int:
    """The id of the newest eviction change (0 before the first)."""
    return int(conn.execute(select(func.max(eviction_audit.c.id))).scalar() or 0)


def list_evictions(
    conn: Connection,
    *,
    states: Collection[str] | None = None,
    node: str | None = None,
    changed_after: int | None = None,
    limit: int = 1000,
) -> list[Row[Any]]:
    """Newest first; ``changed_after`` (a cursor) keeps those whose state changed since."""
    query = select(evictions)
    if states:
        query = query.where(evictions.c.state.in_(states))
    if node is not None:
        query = query.where(evictions.c.node == node)
    if changed_after is not None:
        changed = select(eviction_audit.c.eviction_id).where(eviction_audit.c.id > changed_after)
        query = query.where(evictions.c.id.in_(changed))
    query = query.order_by(evictions.c.id.desc()).limit(limit)
    return list(conn.execute(query))


def open_evictions(conn: Connection) -> list[Row[Any]]:
    """Every eviction in one of :data:`OPEN_STATES`."""
    return list(conn.execute(select(evictions).where(evictions.c.state.in_(OPEN_STATES))))


def last_returns(conn: Connection, nodes: Collection[str] | None = None) -> dict[str, datetime]:
    """When each node (of ``nodes``, else every node) last returned to service."""
    query = select(evictions.c.node, func.max(evictions.c.returned_at).label("at")).where(
        evictions.c.returned_at.is_not(None)
    )
    if nodes is not None:
        query = query.where(evictions.c.node.in_(sorted(nodes)))
    return {row.node: row.at for row in conn.execute(query.group_by(evictions.c.node))}


def cooling_nodes(
    conn: Connection, *, since: datetime, nodes: Collection[str] | None = None
) -> set[str]:
    """Nodes (of ``nodes``, else any) whose eviction was rejected or returned after ``since``."""
    query = select(evictions.c.node).where(
        evictions.c.state.in_(("rejected", "returned")), evictions.c.updated_at > since
    )
    if nodes is not None:
        query = query.where(evictions.c.node.in_(sorted(nodes)))
    return set(conn.execute(query).scalars())


def _announce(conn: Connection) -> None:
    """Tell every replica's long-polls that evictions changed, on commit (PostgreSQL only; a
    SQLite server is one process and its long-polls re-read the database)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_notify('fleetwatch_evictions', '')"))


def _row(conn: Connection, eviction_id: int) -> Row[Any]:
    row = conn.execute(select(evictions).where(evictions.c.id == eviction_id)).first()
    if row is None:
        raise NotFound("eviction", str(eviction_id))
    return row


def get_eviction(conn: Connection, eviction_id: int) -> tuple[Row[Any], list[Row[Any]]]:
    """The eviction and its audit trail, oldest change first."""
    row = _row(conn, eviction_id)
    trail = conn.execute(
        select(eviction_audit)
        .where(eviction_audit.c.eviction_id == eviction_id)
        .order_by(eviction_audit.c.ts, eviction_audit.c.id)
    )
    return row, list(trail)


def _audit(
    conn: Connection,
    *,
    eviction_id: int,
    node: str,
    now: datetime,
    from_state: str | None,
    to_state: str,
    actor: str,
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        insert(eviction_audit).values(
            eviction_id=eviction_id,
            node=node,
            ts=now,
            from_state=from_state,
            to_state=to_state,
            actor=actor,
            detail=detail,
        )
    )


def create_eviction(
    conn: Connection,
    *,
    node: str,
    state: str,
    reason_kind: str,
    reason: str,
    evidence: dict[str, Any],
    expected_saving_usd: float | None,
    dry_run: bool,
    now: datetime,
    actor: str = "planner",
    detail: str | None = None,
    repeat_of: int | None = None,
) -> int:
    eviction_id = conn.execute(
        insert(evictions)
        .values(
            repeat_of=repeat_of,
            node=node,
            state=state,
            reason_kind=reason_kind,
            reason=reason,
            evidence=evidence,
            expected_saving_usd=expected_saving_usd,
            dry_run=dry_run,
            created_at=now,
            updated_at=now,
            detail=detail,
        )
        .returning(evictions.c.id)
    ).scalar_one()
    _audit(
        conn,
        eviction_id=eviction_id,
        node=node,
        now=now,
        from_state=None,
        to_state=state,
        actor=actor,
        detail={"reason_kind": reason_kind, "reason": reason}
        | ({"repeat_of": repeat_of} if repeat_of is not None else {}),
    )
    _announce(conn)
    return int(eviction_id)


def _change(
    conn: Connection,
    seen: Row[Any],
    *,
    to_state: str,
    actor: str,
    now: datetime,
    audit: dict[str, Any] | None,
    extra_where: Any = None,
    **values: Any,
) -> bool:
    """Move ``seen`` to ``to_state`` if nobody changed its state since it was read."""
    condition = and_(evictions.c.id == seen.id, evictions.c.state == seen.state)
    if extra_where is not None:
        condition = and_(condition, extra_where)
    result = conn.execute(
        update(evictions).where(condition).values(state=to_state, updated_at=now, **values)
    )
    if result.rowcount != 1:
        return False
    _announce(conn)
    if seen.state != to_state or audit is not None:
        _audit(
            conn,
            eviction_id=seen.id,
            node=seen.node,
            now=now,
            from_state=seen.state,
            to_state=to_state,
            actor=actor,
            detail=audit,
        )
    return True


def _lease_live(row: Row[Any], now: datetime) -> bool:
    return row.lease_expires_at is not None and row.lease_expires_at > now


def _refuse(row: Row[Any], action: str, now: datetime) -> Conflict:
    if row.state == "acked" and _lease_live(row, now):
        return Conflict(
            f"eviction {row.id} is acked by {row.claimed_by!r} until "
            f"{row.lease_expires_at.isoformat()}; it cannot be {action} by another scheduler",
            row.state,
        )
    return Conflict(f"eviction {row.id} is {row.state}; it cannot be {action}", row.state)


def ack_eviction(
    conn: Connection, eviction_id: int, *, claimer: str, lease_s: float, now: datetime
) -> Row[Any]:
    """Claim a pending eviction (or renew one's own claim, or take over an expired one)."""
    seen = _row(conn, eviction_id)
    claimable = seen.state == "pending" or (
        seen.state == "acked" and (seen.claimed_by == claimer or not _lease_live(seen, now))
    )
    if not claimable:
        raise _refuse(seen, "acked", now)
    # The claim condition again, in SQL: what was read may have changed since.
    claim = or_(
        evictions.c.state == "pending",
        evictions.c.claimed_by == claimer,
        evictions.c.lease_expires_at <= now,
    )
    audit = None
    if seen.state == "acked" and seen.claimed_by != claimer:
        audit = {"lease_s": lease_s, "took_over_from": seen.claimed_by}
    elif seen.state == "pending":
        audit = {"lease_s": lease_s}
    won = _change(
        conn,
        seen,
        to_state="acked",
        actor=claimer,
        now=now,
        audit=audit,
        extra_where=claim,
        claimed_by=claimer,
        lease_expires_at=now + timedelta(seconds=lease_s),
    )
    if not won:
        raise _refuse(_row(conn, eviction_id), "acked", now)
    return _row(conn, eviction_id)


def complete_eviction(
    conn: Connection, eviction_id: int, *, claimer: str, now: datetime
) -> Row[Any]:
    """The claimer drained the node. Completing twice is harmless."""
    seen = _row(conn, eviction_id)
    if seen.state == "completed" and seen.claimed_by == claimer:
        return seen
    if seen.state != "acked":
        raise Conflict(
            f"eviction {eviction_id} is {seen.state}; only an acked eviction can be completed "
            "(ack it first)",
            seen.state,
        )
    if seen.claimed_by != claimer:
        raise _refuse(seen, "completed", now)
    won = _change(
        conn,
        seen,
        to_state="completed",
        actor=claimer,
        now=now,
        audit=None,
        extra_where=evictions.c.claimed_by == claimer,
        completed_at=now,
        lease_expires_at=None,
    )
    if not won:
        raise _refuse(_row(conn, eviction_id), "completed", now)
    return _row(conn, eviction_id)


def reject_eviction(
    conn: Connection, eviction_id: int, *, actor: str, reason: str, now: datetime
) -> Row[Any]:
    """The scheduler refuses the drain; the node is not proposed again during the cooldown."""
    seen = _row(conn, eviction_id)
    if seen.state not in _REJECTABLE or (
        seen.state == "acked" and seen.claimed_by != actor and _lease_live(seen, now)
    ):
        raise _refuse(seen, "rejected", now)
    mine = or_(
        evictions.c.state != "acked",
        evictions.c.claimed_by == actor,
        evictions.c.lease_expires_at <= now,
    )
    won = _change(
        conn,
        seen,
        to_state="rejected",
        actor=actor,
        now=now,
        audit={"reason": reason},
        extra_where=mine,
        detail=reason,
        lease_expires_at=None,
    )
    if not won:
        raise _refuse(_row(conn, eviction_id), "rejected", now)
    return _row(conn, eviction_id)


def approve_eviction(
    conn: Connection, eviction_id: int, *, actor: str, note: str, now: datetime
) -> Row[Any]:
    """A person lets a paged eviction (past the drain budget) or a dry-run recommendation drain:
    it becomes pending, over the budget, with who decided and why in the audit log."""
    seen = _row(conn, eviction_id)
    if seen.state not in ("paged", "recommended"):
        raise Conflict(
            f"eviction {eviction_id} is {seen.state}; only a paged or recommended eviction can "
            "be approved",
            seen.state,
        )
    won = _change(
        conn,
        seen,
        to_state="pending",
        actor=actor,
        now=now,
        audit={"approved": note, "over_budget": seen.state == "paged"},
        dry_run=False,
    )
    if not won:
        raise _refuse(_row(conn, eviction_id), "approved", now)
    return _row(conn, eviction_id)


def return_node(
    conn: Connection,
    node: str,
    *,
    actor: str,
    note: str | None,
    now: datetime,
    force_reason: str | None = None,
) -> Row[Any]:
    """The node is back in service: its completed eviction gets ``returned_at`` (MTTR).

    A hardware eviction returns only after a passing validation newer than it
    (:func:`fleetwatch.server.repo.validations.return_blocker`); else 409 saying what is missing
    or which checks failed, unless ``force_reason`` is given (an admin's decision, audited with
    what it overrode)."""
    seen = conn.execute(
        select(evictions)
        .where(evictions.c.node == node, evictions.c.state == "completed")
        .order_by(evictions.c.id.desc())
        .limit(1)
    ).first()
    if seen is None:
        raise NotFound("completed eviction of node", node)
    blocker = return_blocker(conn, seen)
    if blocker is not None and force_reason is None:
        raise Conflict(
            f'{blocker}. An admin may return it anyway with {{"force": true, "reason": "..."}}',
            seen.state,
        )
    audit: dict[str, Any] = {"note": note} if note else {}
    if blocker is not None and force_reason is not None:
        audit.update(forced=force_reason, blocked_by=blocker)
    won = _change(
        conn,
        seen,
        to_state="returned",
        actor=actor,
        now=now,
        audit=audit or None,
        returned_at=now,
        detail=note if blocker is None or force_reason is None else f"forced: {force_reason}",
    )
    if not won:
        raise _refuse(_row(conn, seen.id), "returned", now)
    return _row(conn, seen.id)


def cancel_eviction(
    conn: Connection, seen: Row[Any], *, why: str, now: datetime, actor: str = "planner"
) -> bool:
    """Withdraw an eviction nobody acted on yet, because its reason cleared."""
    if seen.state not in _CANCELLABLE:
        return False
    return _change(
        conn, seen, to_state="cancelled", actor=actor, now=now, audit={"why": why}, detail=why
    )


def expire_leases(conn: Connection, *, now: datetime) -> int:
    """Acked evictions whose lease ran out become pending again, claimable by anyone."""
    expired = conn.execute(
        select(evictions).where(evictions.c.state == "acked", evictions.c.lease_expires_at <= now)
    ).all()
    done = 0
    for seen in expired:
        done += _change(
            conn,
            seen,
            to_state="pending",
            actor="planner",
            now=now,
            audit={
                "lease_expired": seen.lease_expires_at.isoformat(),
                "claimed_by": seen.claimed_by,
            },
            extra_where=evictions.c.lease_expires_at <= now,
            claimed_by=None,
            lease_expires_at=None,
        )
    return done
