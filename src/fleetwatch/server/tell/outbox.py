"""The durable webhook outbox: rows written in the alert's transaction, delivered by a worker.

States::

    pending --(2xx)--> delivered
    pending --(error, attempts < webhook_max_attempts)--> pending, next_attempt_at = now + backoff
    pending --(error, attempts = webhook_max_attempts)--> dead (last_error kept)

A worker claims a due row by moving its ``next_attempt_at`` a lease ahead with a conditional
``UPDATE ... WHERE state = 'pending' AND next_attempt_at <= now`` whose row count says whether it
won (on PostgreSQL the candidates are read ``FOR UPDATE SKIP LOCKED`` first, so workers do not
even contend). A worker that dies mid-send leaves the row to be retried when the lease ends:
delivery is at least once, and receivers deduplicate on ``Idempotency-Key``. Everything is in the
database, so a restart loses nothing. Backoff: 1 s, 2 s, 4 s ... capped at 10 minutes, +-20 %.
"""

from __future__ import annotations

import functools
import logging
import random
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Connection, and_, func, select, update

from fleetwatch.config import ServerSettings
from fleetwatch.notify.webhooks import render
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import webhook_outbox, webhook_subscriptions
from fleetwatch.server.repo.webhooks import enqueue
from fleetwatch.server.runtime.isolation import ItemGuard

__all__ = [
    "DeliveryPass",
    "OutboxWorker",
    "backoff_s",
    "enqueue_report",
    "report_recipients_waiting",
]

logger = logging.getLogger(__name__)

# A claimed row is the claimer's for this many delivery timeouts (60 s at the default 10 s):
# long enough for a send to finish, short enough that a dead claimer's rows go out soon after.
LEASE_TIMEOUTS = 6
_BATCH = 256
_MAX_BACKOFF_S = 600.0


def backoff_s(attempts: int, rng: Callable[[], float] = random.random) -> float:
    """Wait after the ``attempts``-th failure: 1, 2, 4 ... s, capped at 10 min, jittered +-20 %."""
    base = min(2.0 ** max(attempts - 1, 0), _MAX_BACKOFF_S)
    return min(base * (0.8 + 0.4 * rng()), _MAX_BACKOFF_S)


def _storable(error: str) -> str:
    """An error text PostgreSQL stores: a receiver's body may hold NUL, which ``text`` refuses."""
    return error.replace("\x00", "\\x00")


def _report_subscriptions(conn: Connection) -> list[int]:
    """Enabled generic or Slack subscriptions whose filters say ``weekly_report: true``."""
    subs = conn.execute(
        select(webhook_subscriptions.c.id, webhook_subscriptions.c.filters).where(
            webhook_subscriptions.c.enabled.is_(True),
            webhook_subscriptions.c.kind.in_(("generic", "slack")),
        )
    )
    return [sub.id for sub in subs if (sub.filters or {}).get("weekly_report")]


def _report_key(key: str, subscription_id: int) -> str:
    return f"report:{key}:{subscription_id}"


def report_recipients_waiting(conn: Connection, *, key: str) -> int:
    """How many report subscriptions have not had report ``key`` queued yet: a restarted worker
    need not build a report that every subscriber already has."""
    ids = _report_subscriptions(conn)
    if not ids:
        return 0
    queued = conn.execute(
        select(func.count())
        .select_from(webhook_outbox)
        .where(webhook_outbox.c.idempotency_key.in_([_report_key(key, i) for i in ids]))
    ).scalar_one()
    return len(ids) - int(queued)


def enqueue_report(
    conn: Connection,
    *,
    key: str,
    payload: dict[str, Any],
    now: datetime,
    guard: ItemGuard | None = None,
) -> int:
    """Queue the weekly report ``payload`` for every enabled generic or Slack subscription whose
    filters say ``weekly_report: true``; ``key`` (e.g. the report week) makes it idempotent.
    Returns the number of deliveries queued; one subscription that fails is skipped (``guard``)."""

    def one(subscription_id: int) -> bool:
        made = enqueue(
            conn,
            subscription_id=subscription_id,
            alert_id=None,
            event="report",
            key=_report_key(key, subscription_id),
            payload={"report": payload},
            now=now,
        )
        return made is not None

    done = (guard or ItemGuard("weekly_report")).each(
        conn, _report_subscriptions(conn), one, ident=lambda i: f"subscription {i}"
    )
    return sum(made for _, made in done)


@dataclass
class DeliveryPass:
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    next_run_s: float | None = None  # a full batch: run again at once
    errors: list[str] = field(default_factory=list)


@functools.cache
def _verifying_context() -> ssl.SSLContext:
    """httpx's default context (certifi's CAs, hostnames checked), built once a process: loading
    the CA bundle took 70 ms of each server start."""
    return httpx.create_ssl_context()


class OutboxWorker:
    """Claims due deliveries, sends them (``webhook_concurrency`` at a time), records outcomes."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        client: httpx.Client | None = None,
        rng: Callable[[], float] = random.random,
        guard: ItemGuard | None = None,
        secrets: SecretBox | None = None,
    ) -> None:
        self.db = db
        self.guard = guard or ItemGuard("webhooks")
        self.settings = settings
        # Secrets are stored encrypted (secret_box.py); without keys only plain text opens.
        self.secrets = secrets or SecretBox([])
        # A client given by the caller is the caller's to close.
        self._owns_client = client is None
        self.client = client or httpx.Client(
            timeout=settings.webhook_timeout_s, verify=_verifying_context()
        )
        self.rng = rng
        self._lease = timedelta(seconds=LEASE_TIMEOUTS * settings.webhook_timeout_s)
        self._pool = ThreadPoolExecutor(settings.webhook_concurrency, "webhook")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns_client:
            self.client.close()

    def _claim(self, now: datetime) -> list[Any]:
        due = and_(webhook_outbox.c.state == "pending", webhook_outbox.c.next_attempt_at <= now)
        with self.db.write() as conn:
            query = (
                select(webhook_outbox.c.id)
                .join(webhook_subscriptions)
                .where(due, webhook_subscriptions.c.enabled.is_(True))
                .order_by(webhook_outbox.c.next_attempt_at, webhook_outbox.c.id)
                .limit(_BATCH)
            )
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True, of=webhook_outbox)
            ids = list(conn.execute(query).scalars())
            if not ids:
                return []
            # RETURNING says which rows this worker won (a conditional UPDATE's row count).
            claimed = list(
                conn.execute(
                    update(webhook_outbox)
                    .where(webhook_outbox.c.id.in_(ids), due)
                    .values(next_attempt_at=now + self._lease)
                    .returning(webhook_outbox.c.id)
                ).scalars()
            )
            if not claimed:
                return []
            return list(
                conn.execute(
                    select(
                        webhook_outbox,
                        webhook_subscriptions.c.kind,
                        webhook_subscriptions.c.url,
                        webhook_subscriptions.c.secret,
                    )
                    .join(webhook_subscriptions)
                    .where(webhook_outbox.c.id.in_(claimed))
                )
            )

    def _send(self, row: Any, now: datetime) -> str | None:
        """None when delivered, else the error."""
        try:
            request = render(
                kind=row.kind,
                url=row.url,
                secret=self.secrets.open(row.secret),
                event=row.event,
                idempotency_key=row.idempotency_key,
                payload=row.payload,
                now=now,
                runbook_base_url=self.settings.runbook_base_url,
            )
            response = self.client.post(request.url, content=request.body, headers=request.headers)
        except (httpx.HTTPError, ValueError) as exc:
            return _storable(f"{type(exc).__name__}: {exc}"[:2000])
        except Exception as exc:  # noqa: BLE001 - one delivery that cannot render must not stop the rest
            # Not the receiver's fault: a bug or a payload we cannot render. Counted and logged
            # as an item error; the delivery backs off like any failure, then goes dead.
            self.guard.record_failure(f"delivery {row.id}", exc)
            return _storable(f"{type(exc).__name__}: {exc}"[:2000])
        if response.is_success:
            return None
        return _storable(f"HTTP {response.status_code}: {response.text[:500]}")

    def run_once(self, now: datetime | None = None) -> DeliveryPass:
        now = now or datetime.now(UTC)
        rows = self._claim(now)
        result = DeliveryPass(claimed=len(rows))
        if not rows:
            return result
        outcomes = list(self._pool.map(lambda r: self._send(r, now), rows))
        done = max(now, datetime.now(UTC))
        delivered = [row.id for row, error in zip(rows, outcomes, strict=True) if error is None]
        result.delivered = len(delivered)
        with self.db.write() as conn:
            if delivered:
                conn.execute(
                    update(webhook_outbox)
                    .where(webhook_outbox.c.id.in_(delivered))
                    .values(
                        state="delivered",
                        delivered_at=done,
                        last_error=None,
                        attempts=webhook_outbox.c.attempts + 1,
                    )
                )
            failed = [(row, error) for row, error in zip(rows, outcomes, strict=True) if error]
            recorded = self.guard.each(
                conn,
                failed,
                lambda item: self._failed(conn, item[0], item[1], now),
                ident=lambda item: f"delivery {item[0].id}",
            )
            for _, outcome in recorded:
                if outcome == "dead":
                    result.dead += 1
                else:
                    result.retried += 1
        if len(rows) >= _BATCH:
            result.next_run_s = 0.0
        return result

    def _failed(self, conn: Connection, row: Any, error: str, now: datetime) -> str:
        """Record a failed attempt; "dead" or "retried"."""
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "last_error": error}
        if attempts >= self.settings.webhook_max_attempts:
            values["state"] = "dead"
            logger.error("webhook delivery %d dead after %d attempts: %s", row.id, attempts, error)
        else:
            wait = timedelta(seconds=backoff_s(attempts, self.rng))
            values["next_attempt_at"] = now + wait
            logger.warning(
                "webhook delivery %d failed (attempt %d), retrying in %.0f s: %s",
                row.id,
                attempts,
                wait.total_seconds(),
                error,
            )
        conn.execute(update(webhook_outbox).where(webhook_outbox.c.id == row.id).values(**values))
        return str(values.get("state", "retried"))
