"""Webhook payload formats: generic (signed JSON), Slack, PagerDuty Events API v2, Alertmanager.

An outbox row holds a neutral payload: ``{"alerts": [alert, ...], "group_key": str | None}`` for
trigger and resolve deliveries, ``{"report": {...}}`` for the weekly report. :func:`render` turns
it into one HTTP request for the subscription's kind at send time.

Verifying a generic delivery (receivers should do this)::

    timestamp = request.headers["X-FleetWatch-Timestamp"]      # unix seconds
    header    = request.headers["X-FleetWatch-Signature"]      # "v1=<hex>"
    expected  = hmac.new(secret, f"{timestamp}.".encode() + raw_body, hashlib.sha256).hexdigest()
    ok = hmac.compare_digest(header.removeprefix("v1="), expected)
         and abs(time.time() - int(timestamp)) <= 300         # refuse replays of old requests

:func:`verify_signature` does exactly that. Sign and check the raw body bytes, before any JSON
parsing. Deliveries are at least once: deduplicate on ``Idempotency-Key`` (also in the body).

Every alert in every format carries ``runbook_url``, the page for its kind
(:func:`fleetwatch.runbooks.runbook_url`): added at send time, from the sending server's
``runbook_base_url``, so a changed base applies to deliveries already queued.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.rules.xid_catalog import SEVERITY_RANK
from fleetwatch.runbooks import DEFAULT_BASE_URL, runbook_url

__all__ = [
    "KINDS",
    "PAGERDUTY_EVENTS_URL",
    "OutgoingRequest",
    "alert_document",
    "render",
    "sign",
    "verify_signature",
]

KINDS = ("generic", "slack", "pagerduty", "alertmanager")
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
# Our severities to PagerDuty's: a fatal GPU pages as critical.
_PD_SEVERITY = {"fatal": "critical", "critical": "error", "warning": "warning", "info": "info"}
_SLACK_LINES = 20


@dataclass(frozen=True)
class OutgoingRequest:
    url: str
    headers: dict[str, str]
    body: bytes


def alert_document(row: Any) -> dict[str, Any]:
    """The public shape of one alert (an ``alerts`` row mapping), in webhooks and the API."""
    evidence = dict(row["evidence"] or {})

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": row["id"],
        "dedup_key": row["dedup_key"],
        "state": row["state"],
        "kind": row["kind"],
        "rule": evidence.get("rule"),
        "severity": row["severity"],
        "node": row["node"],
        "gpu_index": evidence.get("gpu_index"),
        "gpu_uuid": row["gpu_uuid"],
        "serial": row["serial"],
        "slot": row["slot"],
        "cluster": row["cluster"],
        "summary": row["summary"],
        "action": row["action"],
        "evidence": evidence,
        "occurrences": row["occurrences"],
        "started_at": iso(row["started_at"]),
        "updated_at": iso(row["updated_at"]),
        "resolved_at": iso(row["resolved_at"]),
    }


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256 of "{timestamp}.{body}">``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(
    secret: str,
    timestamp: str | int,
    body: bytes,
    header: str,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> bool:
    """Whether ``header`` (``X-FleetWatch-Signature``) signs ``body`` at ``timestamp``
    (``X-FleetWatch-Timestamp``) with ``secret``, and the timestamp is within ``tolerance_s``."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    given = [part.strip() for part in header.split(",")]
    expected = sign(secret, ts, body)
    return any(hmac.compare_digest(candidate, expected) for candidate in given)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str).encode()


def render(
    *,
    kind: str,
    url: str,
    secret: str | None,
    event: str,
    idempotency_key: str,
    payload: dict[str, Any],
    now: datetime,
    runbook_base_url: str = DEFAULT_BASE_URL,
) -> OutgoingRequest:
    """The request that delivers ``payload`` to a subscription of ``kind``."""
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": idempotency_key,
        "User-Agent": "fleetwatch-webhooks",
    }
    alerts = [_with_runbook(a, runbook_base_url) for a in payload.get("alerts", [])]
    if kind == "generic":
        body_doc: dict[str, Any] = {"idempotency_key": idempotency_key, "event": event}
        if "report" in payload:
            body_doc["report"] = payload["report"]
        elif len(alerts) == 1 and not payload.get("group_key"):
            body_doc["alert"] = alerts[0]
        else:
            body_doc.update(group_key=payload.get("group_key"), count=len(alerts), alerts=alerts)
        body = _dumps(body_doc)
        ts = int(now.timestamp())
        headers["X-FleetWatch-Timestamp"] = str(ts)
        headers["X-FleetWatch-Signature"] = sign(secret or "", ts, body)
        return OutgoingRequest(url, headers, body)
    if kind == "slack":
        return OutgoingRequest(url, headers, _dumps(_slack(event, payload, alerts)))
    if kind == "pagerduty":
        return OutgoingRequest(url, headers, _dumps(_pagerduty(secret, event, payload, alerts)))
    if kind == "alertmanager":
        target = url.rstrip("/") + "/api/v2/alerts"
        return OutgoingRequest(target, headers, _dumps(_alertmanager(event, alerts, now, payload)))
    raise ValueError(f"unknown webhook kind {kind!r}")


def _with_runbook(alert: dict[str, Any], base_url: str) -> dict[str, Any]:
    return {**alert, "runbook_url": runbook_url(base_url, alert["kind"], alert.get("rule"))}


def _slack_link(alert: dict[str, Any]) -> str:
    """The runbook as a Slack link where it is absolute (Slack cannot resolve a path)."""
    url = str(alert["runbook_url"])
    return f"<{url}|runbook>" if _absolute(url) else f"runbook: {url}"


def _absolute(url: str) -> bool:
    return url.startswith(("https://", "http://"))


def _line(alert: dict[str, Any]) -> str:
    where = alert.get("node") or "fleet"
    if alert.get("gpu_index") is not None:
        where += f" GPU {alert['gpu_index']}"
    action = f" → {alert['action']}" if alert.get("action") else ""
    return f"[{alert['severity']}] {where}: {alert['summary']}{action}"


def _slack(event: str, payload: dict[str, Any], alerts: list[dict[str, Any]]) -> dict[str, Any]:
    if "report" in payload:
        report = payload["report"]
        text = str(report.get("summary") or report.get("title") or "FleetWatch weekly report")
        return {
            "text": text,
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}],
        }
    verb = "RESOLVED" if event == "resolve" else "FIRING"
    if len(alerts) == 1 and not payload.get("group_key"):
        a = alerts[0]
        text = f"{verb}: {_line(a)}"
        fields = [
            f"*Node:* {a.get('node') or '-'}",
            f"*GPU:* {a.get('gpu_index', '-')} {a.get('gpu_uuid') or ''}",
            f"*Serial:* {a.get('serial') or '-'}",
            f"*Slot:* {a.get('slot') or '-'}",
            f"*Cluster:* {a.get('cluster') or '-'}",
            f"*Action:* {a.get('action') or '-'}",
            f"*Runbook:* {_slack_link(a)}",
        ]
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*"}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        ]
        return {"text": text, "blocks": blocks}
    text = f"{verb}: {len(alerts)} FleetWatch alerts"
    lines = [f"{_line(a)} ({_slack_link(a)})" for a in alerts[:_SLACK_LINES]]
    if len(alerts) > _SLACK_LINES:
        lines.append(f"... and {len(alerts) - _SLACK_LINES} more")
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}},
        ],
    }


def _pagerduty(
    routing_key: str | None, event: str, payload: dict[str, Any], alerts: list[dict[str, Any]]
) -> dict[str, Any]:
    group_key = payload.get("group_key")
    if len(alerts) == 1 and not group_key:
        a = alerts[0]
        dedup, summary, severity = a["dedup_key"], _line(a), a["severity"]
        source, component, klass = a.get("node") or "fleetwatch", a.get("gpu_uuid"), a.get("rule")
        details: dict[str, Any] = a
    else:
        worst = max(alerts, key=lambda a: SEVERITY_RANK.get(a["severity"], 0))
        dedup, severity = str(group_key), worst["severity"]
        summary = f"{len(alerts)} FleetWatch alerts, e.g. {_line(alerts[0])}"
        source, component, klass = "fleetwatch", None, "group"
        details = {"count": len(alerts), "alerts": alerts}
    # Events API v2 shows ``links`` on the incident, one per runbook page the alerts need; only
    # absolute ones (a bare path means nothing to PagerDuty: custom_details still carry it).
    runbooks = dict.fromkeys(a["runbook_url"] for a in alerts if _absolute(a["runbook_url"]))
    return {
        "routing_key": routing_key,
        "event_action": "resolve" if event == "resolve" else "trigger",
        "dedup_key": dedup,
        "payload": {
            "summary": summary[:1024],
            "source": source,
            "severity": _PD_SEVERITY.get(severity, "warning"),
            "component": component,
            "group": alerts[0].get("cluster") if alerts else None,
            "class": klass,
            "custom_details": details,
        },
        "links": [{"href": url, "text": f"Runbook: {url.rsplit('/', 1)[-1]}"} for url in runbooks],
    }


def _alertmanager(
    event: str, alerts: list[dict[str, Any]], now: datetime, payload: dict[str, Any]
) -> list[dict[str, Any]]:
    """Firing alerts carry ``endsAt`` ``ends_in_s`` ahead and are re-posted before then, so an
    Alertmanager that stops hearing from FleetWatch resolves them by itself; a resolve sets
    ``endsAt`` to now."""
    ends_in = timedelta(seconds=float(payload.get("ends_in_s", 180.0)))
    out = []
    for a in alerts:
        labels = {
            "alertname": f"FleetWatch_{a.get('rule') or a['kind']}",
            "severity": a["severity"],
            "node": a.get("node") or "",
            "gpu": "" if a.get("gpu_index") is None else str(a["gpu_index"]),
            "uuid": a.get("gpu_uuid") or "",
            "cluster": a.get("cluster") or "",
            "dedup_key": a["dedup_key"],
        }
        ends = now if event == "resolve" or a["state"] == "resolved" else now + ends_in
        out.append(
            {
                "labels": {k: v for k, v in labels.items() if v},
                "annotations": {
                    "summary": a["summary"],
                    "action": a.get("action") or "",
                    "serial": a.get("serial") or "",
                    "slot": a.get("slot") or "",
                    "runbook_url": a["runbook_url"],
                },
                "startsAt": a["started_at"],
                "endsAt": ends.isoformat(),
            }
        )
    return out
