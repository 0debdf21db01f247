"""Webhook payload formats and the generic format's signature, without a database."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest

from fleetwatch.notify.webhooks import render, sign, verify_signature
from fleetwatch.server.tell.alerting import matches
from fleetwatch.server.tell.outbox import backoff_s

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def _alert(**overrides: object) -> dict[str, object]:
    alert = {
        "id": 7,
        "dedup_key": "gpu:GPU-1:xid79",
        "state": "firing",
        "kind": "xid",
        "rule": "xid79",
        "severity": "fatal",
        "node": "node-a",
        "gpu_index": 3,
        "gpu_uuid": "GPU-1",
        "serial": "1650000001",
        "slot": "0000:1b:00.0",
        "cluster": "a",
        "summary": "xid79 on node-a GPU 3: GPU has fallen off the bus",
        "action": "reboot_node",
        "evidence": {"rule": "xid79", "gpu_index": 3},
        "occurrences": 1,
        "started_at": NOW.isoformat(),
        "updated_at": NOW.isoformat(),
        "resolved_at": None,
    }
    alert.update(overrides)
    return alert


def _render(kind: str, event: str = "trigger", **payload: object) -> tuple[dict[str, str], object]:
    request = render(
        kind=kind,
        url="http://receiver.test/hook",
        secret="routing-or-hmac",
        event=event,
        idempotency_key="trigger:s1:a7",
        payload={"alerts": [_alert()], **payload},
        now=NOW,
    )
    return request.headers, json.loads(request.body)


def test_generic_format_carries_the_alert_and_a_verifiable_signature() -> None:
    request = render(
        kind="generic",
        url="http://r.test/",
        secret="k",
        event="trigger",
        idempotency_key="trigger:s1:a7",
        payload={"alerts": [_alert()]},
        now=NOW,
    )
    body = json.loads(request.body)
    assert body["idempotency_key"] == request.headers["Idempotency-Key"] == "trigger:s1:a7"
    assert body["event"] == "trigger" and body["alert"]["action"] == "reboot_node"
    assert body["alert"]["runbook_url"] == "/runbooks/xid"  # the default: this server's path
    ts = request.headers["X-FleetWatch-Timestamp"]
    assert ts == str(int(NOW.timestamp()))
    expected = hmac.new(b"k", f"{ts}.".encode() + request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-FleetWatch-Signature"] == f"v1={expected}"
    header = request.headers["X-FleetWatch-Signature"]
    assert verify_signature("k", ts, request.body, header, now=NOW.timestamp() + 10)


def test_verify_signature_refuses_tampering_wrong_key_and_stale_timestamps() -> None:
    body, ts = b'{"a":1}', int(NOW.timestamp())
    header = sign("k", ts, body)
    now = NOW.timestamp()
    assert verify_signature("k", ts, body, header, now=now)
    assert not verify_signature("k", ts, b'{"a":2}', header, now=now)
    assert not verify_signature("other", ts, body, header, now=now)
    assert not verify_signature("k", ts + 1, body, header, now=now)
    assert not verify_signature("k", ts, body, header, tolerance_s=300, now=now + 301)
    assert not verify_signature("k", "not-a-number", body, header, now=now)
    # Several signatures (key rotation) in one header: any may match.
    assert verify_signature("k", ts, body, f"v1=deadbeef, {header}", now=now)


def test_slack_format_has_text_and_blocks() -> None:
    _, body = _render("slack")
    assert isinstance(body, dict)
    assert body["text"].startswith("FIRING: [fatal] node-a GPU 3")
    assert body["blocks"][0]["type"] == "section"
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert "*Runbook:* runbook: /runbooks/xid" in fields  # a path: not a Slack link
    _, grouped = _render("slack", group_key="g1")
    assert isinstance(grouped, dict) and grouped["text"] == "FIRING: 1 FleetWatch alerts"
    assert grouped["blocks"][1]["text"]["text"].endswith("(runbook: /runbooks/xid)")


def test_slack_links_an_absolute_runbook() -> None:
    request = render(
        kind="slack",
        url="http://receiver.test/hook",
        secret=None,
        event="trigger",
        idempotency_key="k",
        payload={"alerts": [_alert(kind="host", rule="port_down")]},
        now=NOW,
        runbook_base_url="https://fw.example/runbooks/",
    )
    fields = [f["text"] for f in json.loads(request.body)["blocks"][1]["fields"]]
    assert "*Runbook:* <https://fw.example/runbooks/ports|runbook>" in fields


def test_pagerduty_format_is_events_v2() -> None:
    _, body = _render("pagerduty")
    assert isinstance(body, dict)
    assert body["routing_key"] == "routing-or-hmac" and body["event_action"] == "trigger"
    assert body["dedup_key"] == "gpu:GPU-1:xid79"
    payload = body["payload"]
    assert payload["severity"] == "critical" and payload["source"] == "node-a"
    assert payload["component"] == "GPU-1" and payload["group"] == "a"
    assert payload["class"] == "xid79" and payload["custom_details"]["serial"] == "1650000001"
    assert payload["custom_details"]["runbook_url"] == "/runbooks/xid"
    assert body["links"] == []  # PagerDuty takes absolute links only
    _, resolve = _render("pagerduty", event="resolve")
    assert isinstance(resolve, dict) and resolve["event_action"] == "resolve"
    _, grouped = _render("pagerduty", group_key="s1:g7-7:1")
    assert isinstance(grouped, dict) and grouped["dedup_key"] == "s1:g7-7:1"
    assert grouped["payload"]["custom_details"]["alerts"][0]["runbook_url"] == "/runbooks/xid"


def test_pagerduty_links_each_runbook_once() -> None:
    alerts = [_alert(), _alert(id=8, dedup_key="gpu:GPU-2:xid79"), _alert(id=9, kind="wear_out")]
    request = render(
        kind="pagerduty",
        url="http://receiver.test/hook",
        secret="routing",
        event="trigger",
        idempotency_key="k",
        payload={"alerts": alerts, "group_key": "s1:g7-9:3"},
        now=NOW,
        runbook_base_url="https://fw.example/runbooks",
    )
    assert json.loads(request.body)["links"] == [
        {"href": "https://fw.example/runbooks/xid", "text": "Runbook: xid"},
        {"href": "https://fw.example/runbooks/wear_out", "text": "Runbook: wear_out"},
    ]


def test_alertmanager_format_posts_a_list_to_api_v2() -> None:
    request = render(
        kind="alertmanager",
        url="http://am.test:9093/",
        secret=None,
        event="trigger",
        idempotency_key="k",
        payload={"alerts": [_alert()], "ends_in_s": 180.0},
        now=NOW,
    )
    assert request.url == "http://am.test:9093/api/v2/alerts"
    [alert] = json.loads(request.body)
    assert alert["labels"] == {
        "alertname": "FleetWatch_xid79",
        "severity": "fatal",
        "node": "node-a",
        "gpu": "3",
        "uuid": "GPU-1",
        "cluster": "a",
        "dedup_key": "gpu:GPU-1:xid79",
    }
    assert alert["annotations"]["action"] == "reboot_node"
    assert alert["annotations"]["runbook_url"] == "/runbooks/xid"
    assert datetime.fromisoformat(alert["endsAt"]) == NOW.replace(minute=3)
    resolved = render(
        kind="alertmanager",
        url="http://am.test:9093",
        secret=None,
        event="resolve",
        idempotency_key="k",
        payload={"alerts": [_alert(state="resolved")]},
        now=NOW,
    )
    assert datetime.fromisoformat(json.loads(resolved.body)[0]["endsAt"]) == NOW


@pytest.mark.parametrize(
    ("filters", "alert", "wanted"),
    [
        ({}, {"severity": "warning", "kind": "xid"}, True),
        ({}, {"severity": "info", "kind": "xid"}, False),
        ({"min_severity": "fatal"}, {"severity": "critical", "kind": "xid"}, False),
        ({"clusters": ["a"]}, {"severity": "fatal", "kind": "xid", "cluster": "b"}, False),
        ({"clusters": ["a"]}, {"severity": "fatal", "kind": "xid", "cluster": "a"}, True),
        ({"clusters": ["a"]}, {"severity": "critical", "kind": "drain_budget"}, True),
        ({"kinds": ["unreachable"]}, {"severity": "fatal", "kind": "xid"}, False),
    ],
)
def test_filters_match_severity_cluster_and_kind(
    filters: dict[str, object], alert: dict[str, object], wanted: bool
) -> None:
    assert matches(filters, alert) is wanted


def test_backoff_doubles_from_one_second_and_caps_at_ten_minutes() -> None:
    assert [backoff_s(n, rng=lambda: 0.5) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(30, rng=lambda: 1.0) == 600.0
    assert 0.8 <= backoff_s(1, rng=lambda: 0.0) <= 1.2
