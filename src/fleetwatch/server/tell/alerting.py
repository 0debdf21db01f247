"""Alerts: the fleet's active conditions, deduplicated, turned into webhook deliveries.

Each pass derives the set of active conditions, each with a dedup key
(:mod:`fleetwatch.server.tell.conditions`), and compares it with the firing alerts. A new
condition opens an alert (``firing``) and queues a ``trigger`` for each matching subscription;
one still active only counts ``occurrences`` (a flood of Xids is one page) and moves the alert's
``updated_at`` (its last-seen time); one gone resolves its alert and queues a ``resolve``, but
only on evidence that covers the alert:

- a process with no assessment yet resolves nothing (a pass right after a start must not page
  on-call "resolved" and then fire again);
- a GPU alert resolves only from an assessment of its node made after the alert was last seen
  (``snapshot.judged_at(node) > updated_at``): with several workers, one whose snapshot is older
  than another's newest pass must not resolve what that pass fired or still saw, and a snapshot
  the urgent lane patched for a few nodes is as old as its whole-fleet pass for the others;
- an unreachable alert does not resolve while its node is *unheard* (silent, but this process has
  not been up long enough to tell, see :mod:`fleetwatch.server.concepts.liveness`): it resolves when
  the node reports again. One whose node went into a maintenance window resolves (its silence
  is planned now). During a fleet-wide silence (:mod:`fleetwatch.server.judge.silence`) no new
  one fires (one ``fleet_silence`` alert does) and a firing one stays while its node is silent.

When more than ``alert_group_threshold`` new alerts match one subscription in one pass, they go
as one grouped delivery listing them (an Xid storm over 100 nodes is one page, not 100); their
resolves are grouped the same way, and for generic, Slack and PagerDuty the group resolves once
all its members have. Alertmanager gets every firing alert again every ``alertmanager_repeat_s``.

Filters of a subscription: ``min_severity`` (info < warning < critical < fatal), ``clusters``
(the node label ``cluster``), ``kinds`` (alert kinds: xid, health, host, unreachable, straggler,
drain_budget, wear_out, repeat_offender, fleet_silence, unreadable_evidence). Fleet-wide alerts
have no cluster and pass a cluster filter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, and_, insert, select, update

from fleetwatch.config import ServerSettings
from fleetwatch.notify.webhooks import alert_document
from fleetwatch.rules.xid_catalog import SEVERITY_RANK
from fleetwatch.server.concepts.planned import Planned
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, webhook_outbox, webhook_subscriptions
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.judge.silence import FleetSilence, fleet_silence, node_clocks
from fleetwatch.server.repo.maintenance import load_planned
from fleetwatch.server.repo.nodes import unheard_nodes
from fleetwatch.server.repo.webhooks import enqueue
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.locks import LockKey, transaction_lock, try_transaction_lock
from fleetwatch.server.tell.conditions import (
    Condition,
    derive_conditions,
    gpu_conditions,
    node_clusters,
)

__all__ = ["AlertPass", "Alerter", "matches"]

logger = logging.getLogger(__name__)

_GROUPABLE = ("generic", "slack", "pagerduty")


@dataclass
class AlertPass:
    fired: int = 0
    still: int = 0
    resolved: int = 0
    queued: int = 0
    ids: list[int] = field(default_factory=list)


def matches(filters: Mapping[str, Any] | None, alert: Mapping[str, Any]) -> bool:
    """Whether an alert document passes a subscription's filters."""
    filters = filters or {}
    minimum = filters.get("min_severity") or "warning"
    if SEVERITY_RANK.get(alert["severity"], 0) < SEVERITY_RANK.get(minimum, 1):
        return False
    wanted = filters.get("clusters")
    if wanted and alert.get("cluster") is not None and alert["cluster"] not in wanted:
        return False
    kinds = filters.get("kinds")
    return not (kinds and alert["kind"] not in kinds)


class Alerter:
    """Keeps ``alerts`` in step with the active conditions and queues deliveries."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        assessment: Callable[[], FleetAssessment | None],
        on_queued: Callable[[], None] = lambda: None,
        guard: ItemGuard | None = None,
        heard_since: datetime | None = None,
    ) -> None:
        self.db = db
        # When this process started listening (None: judge silence by last_seen alone).
        self.heard_since = heard_since
        self.guard = guard or ItemGuard("alerts")
        self.settings = settings
        self.assessment = assessment
        self.on_queued = on_queued
        self._lock = threading.Lock()

    def run_once(self, now: datetime | None = None) -> AlertPass:
        now = now or datetime.now(UTC)
        # One pass at a time in this process (its own loop and the assessments' passes): a
        # second one waits, then reads the newest snapshot, rather than skip on the database
        # lock while the first acts on an older one.
        with self._lock:
            snapshot = self.assessment()
            with self.db.write() as conn:
                if not try_transaction_lock(conn, LockKey.ALERTS):
                    return AlertPass()
                planned = load_planned(conn, now)
                clocks = node_clocks(conn)  # one read for the silence and the conditions
                silence = fleet_silence(
                    conn,
                    self.settings,
                    now=now,
                    heard_since=self.heard_since,
                    planned=planned,
                    clocks=clocks,
                )
                active = derive_conditions(
                    conn,
                    snapshot,
                    now=now,
                    settings=self.settings,
                    heard_since=self.heard_since,
                    planned=planned,
                    silence=silence,
                    clocks=clocks,
                )
                covered = self._coverage(conn, snapshot, now, planned, silence)
                result = self._pass(conn, active, now, covered)
        if result.queued:
            self.on_queued()
        logger.debug(
            "alerts: %d fired, %d still, %d resolved, %d deliveries queued",
            result.fired,
            result.still,
            result.resolved,
            result.queued,
        )
        return result

    def run_for(self, names: Collection[str], now: datetime | None = None) -> AlertPass:
        """Fire (or count) the alerts of the GPU verdicts of nodes ``names`` only: the urgent
        lane's pass, after a targeted assessment of those nodes.

        It only adds: a condition of another node, or one of these nodes gone, is left to the
        whole pass (deriving the conditions of 100,000 GPUs takes seconds, which a fatal Xid
        should not wait for; resolving needs that whole view).
        """
        now = now or datetime.now(UTC)
        wanted = frozenset(names)
        if not wanted:
            return AlertPass()
        with self._lock:
            snapshot = self.assessment()
            with self.db.write() as conn:
                # Waits, rather than skips, for another process's pass: a page that skipped
                # would wait a whole alert interval.
                transaction_lock(conn, LockKey.ALERTS)
                planned = load_planned(conn, now)
                active = gpu_conditions(
                    conn, snapshot, planned, node_clusters(conn, wanted), only=wanted
                )
                result = self._pass(conn, active, now, covered=lambda row: False)
        if result.queued:
            self.on_queued()
        logger.debug(
            "alerts for %d nodes: %d fired, %d still, %d deliveries queued",
            len(wanted),
            result.fired,
            result.still,
            result.queued,
        )
        return result

    def _coverage(
        self,
        conn: Connection,
        snapshot: FleetAssessment | None,
        now: datetime,
        planned: Planned | None = None,
        silence: FleetSilence | None = None,
    ) -> Callable[[Any], bool]:
        """Whether this pass's evidence covers a firing alert, so that its absence resolves it."""
        if snapshot is None:
            return lambda row: False  # no assessment yet: nothing is known to have cleared
        factor = self.settings.unreachable_after_intervals
        unheard = unheard_nodes(
            conn,
            now=now,
            factor=factor,
            heard_since=self.heard_since,
            planned=planned,
            lag_s=silence.lag_s if silence is not None else 0.0,
        )

        def covers(row: Any) -> bool:
            if row.dedup_key.startswith("gpu:"):
                # A snapshot patched by the urgent lane judged only some nodes anew: the others
                # are as of the whole-fleet pass it was built on.
                return bool(snapshot.judged_at(row.node) > row.updated_at)
            if row.kind == "unreachable":
                # In a fleet-wide silence its node is no condition of its own, yet still silent.
                storm_silent = silence is not None and silence.storm and row.node in silence.silent
                # Past its own deadline, within the fleet's ingest lag: still silent too.
                lag_held = silence is not None and row.node in silence.held_by_lag
                return row.node not in unheard and not storm_silent and not lag_held
            return True  # derived from the database at this pass's own ``now``

        return covers

    def _pass(
        self,
        conn: Connection,
        active: dict[str, Condition],
        now: datetime,
        covered: Callable[[Any], bool] = lambda row: True,
    ) -> AlertPass:
        result = AlertPass()
        firing = {
            row.dedup_key: row
            for row in conn.execute(select(alerts).where(alerts.c.state == "firing"))
        }
        # Each alert, resolve and subscription is an item of its own: one the database refuses
        # is logged and counted, and every other node still pages (see server.runtime.isolation).
        new_docs, gone_docs = [], []
        opened = self.guard.each(
            conn,
            active.items(),
            lambda item: self._open_or_touch(conn, item[1], firing, now),
            ident=lambda item: item[0],
        )
        for _, doc in opened:
            if doc is None:
                result.still += 1
            else:
                result.fired += 1
                result.ids.append(doc["id"])
                new_docs.append(doc)
        gone = [row for key, row in firing.items() if key not in active and covered(row)]
        resolved = self.guard.each(
            conn, gone, lambda row: self._resolve(conn, row, now), ident=lambda row: row.dedup_key
        )
        for _, doc in resolved:
            result.resolved += 1
            gone_docs.append(doc)
        subs = list(
            conn.execute(
                select(webhook_subscriptions).where(webhook_subscriptions.c.enabled.is_(True))
            )
        )
        delivered = self.guard.each(
            conn,
            subs,
            lambda sub: self._deliver(conn, sub, new_docs, gone_docs, now),
            ident=lambda sub: f"subscription {sub.id}",
        )
        result.queued += sum(queued for _, queued in delivered)
        return result

    def _open_or_touch(
        self, conn: Connection, cond: Condition, firing: dict[str, Any], now: datetime
    ) -> dict[str, Any] | None:
        """Open an alert for a new condition (its document), or count one still firing (None)."""
        row = firing.get(cond.dedup_key)
        values = {
            "severity": cond.severity,
            "summary": cond.summary,
            "action": cond.action,
            "evidence": cond.evidence,
            "updated_at": now,
        }
        if row is not None:
            conn.execute(
                update(alerts)
                .where(alerts.c.id == row.id)
                .values(occurrences=alerts.c.occurrences + 1, **values)
            )
            return None
        alert_id = conn.execute(
            insert(alerts)
            .values(
                dedup_key=cond.dedup_key,
                state="firing",
                kind=cond.kind,
                node=cond.node,
                gpu_uuid=cond.gpu_uuid,
                serial=cond.serial,
                slot=cond.slot,
                cluster=cond.cluster,
                occurrences=1,
                started_at=now,
                **values,
            )
            .returning(alerts.c.id)
        ).scalar_one()
        return self._doc(conn, alert_id)

    def _resolve(self, conn: Connection, row: Any, now: datetime) -> dict[str, Any]:
        conn.execute(
            update(alerts)
            .where(alerts.c.id == row.id)
            .values(state="resolved", resolved_at=now, updated_at=now)
        )
        return self._doc(conn, row.id)

    @staticmethod
    def _doc(conn: Connection, alert_id: int) -> dict[str, Any]:
        row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).one()
        return alert_document(row._mapping)

    def _deliver(
        self,
        conn: Connection,
        sub: Any,
        new: list[dict[str, Any]],
        gone: list[dict[str, Any]],
        now: datetime,
    ) -> int:
        queued = 0
        grouped = self._open_groups(conn, sub) if sub.kind in _GROUPABLE else {}
        in_group = {alert_id for ids in grouped.values() for alert_id in ids}
        triggers = [a for a in new if matches(sub.filters, a)]
        resolves = [a for a in gone if a["id"] not in in_group and matches(sub.filters, a)]
        for event, docs in (("trigger", triggers), ("resolve", resolves)):
            queued += self._queue(conn, sub, event, docs, now)
        # A group resolves, as one delivery, once every alert in it has.
        gone_ids = {a["id"] for a in gone}
        for group_key, ids in grouped.items():
            if not ids & gone_ids:
                continue
            states = conn.execute(select(alerts).where(alerts.c.id.in_(ids))).all()
            if all(row.state == "resolved" for row in states):
                docs = [alert_document(row._mapping) for row in states]
                queued += (
                    enqueue(
                        conn,
                        subscription_id=sub.id,
                        alert_id=None,
                        event="resolve",
                        key=f"resolve:{group_key}",
                        payload={"alerts": docs, "group_key": group_key},
                        now=now,
                    )
                    is not None
                )
        if sub.kind == "alertmanager":
            queued += self._refresh_alertmanager(conn, sub, now)
        return queued

    def _queue(
        self, conn: Connection, sub: Any, event: str, docs: list[dict[str, Any]], now: datetime
    ) -> int:
        if not docs:
            return 0
        extra = {"ends_in_s": 3 * self.settings.alertmanager_repeat_s}
        if len(docs) > self.settings.alert_group_threshold:
            group_key = f"s{sub.id}:g{docs[0]['id']}-{docs[-1]['id']}:{len(docs)}"
            made = enqueue(
                conn,
                subscription_id=sub.id,
                alert_id=None,
                event=event,
                key=f"{event}:{group_key}",
                payload={"alerts": docs, "group_key": group_key, **extra},
                now=now,
            )
            return int(made is not None)
        queued = 0
        for doc in docs:
            made = enqueue(
                conn,
                subscription_id=sub.id,
                alert_id=doc["id"],
                event=event,
                key=f"{event}:s{sub.id}:a{doc['id']}",
                payload={"alerts": [doc], **extra},
                now=now,
            )
            queued += made is not None
        return queued

    @staticmethod
    def _open_groups(conn: Connection, sub: Any) -> dict[str, set[int]]:
        """Grouped triggers to this subscription whose group resolve is not queued yet."""
        rows = conn.execute(
            select(webhook_outbox.c.idempotency_key, webhook_outbox.c.payload).where(
                and_(
                    webhook_outbox.c.subscription_id == sub.id,
                    webhook_outbox.c.event == "trigger",
                    webhook_outbox.c.alert_id.is_(None),
                    webhook_outbox.c.idempotency_key.like("trigger:s%:g%"),
                )
            )
        ).all()
        if not rows:
            return {}
        keys = [f"resolve:{row.payload['group_key']}" for row in rows]
        done = set(
            conn.execute(
                select(webhook_outbox.c.idempotency_key).where(
                    webhook_outbox.c.idempotency_key.in_(keys)
                )
            ).scalars()
        )
        return {
            row.payload["group_key"]: {a["id"] for a in row.payload["alerts"]}
            for row in rows
            if f"resolve:{row.payload['group_key']}" not in done
        }

    def _refresh_alertmanager(self, conn: Connection, sub: Any, now: datetime) -> int:
        """Re-post every firing alert once per ``alertmanager_repeat_s`` (one list per period)."""
        repeat = self.settings.alertmanager_repeat_s
        bucket = int(now.timestamp() // repeat)
        key = f"refresh:s{sub.id}:{bucket}"
        docs = [
            alert_document(row._mapping)
            for row in conn.execute(
                select(alerts).where(alerts.c.state == "firing").where(alerts.c.started_at < now)
            )
        ]
        docs = [d for d in docs if matches(sub.filters, d)]
        if not docs:
            return 0
        made = enqueue(
            conn,
            subscription_id=sub.id,
            alert_id=None,
            event="trigger",
            key=key,
            payload={"alerts": docs, "group_key": key, "ends_in_s": 3 * repeat},
            now=now,
        )
        return int(made is not None)
