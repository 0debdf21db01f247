"""Alerts from verdicts, the outbox's retries, and the webhook API, on SQLite and PostgreSQL.

HTTP goes through ``httpx.MockTransport``: each test sees exactly the requests the worker sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

from fleetwatch.config import ServerSettings
from fleetwatch.notify.webhooks import verify_signature
from fleetwatch.server.app import create_app
from fleetwatch.server.db.secret_box import load_secret_box
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import webhook_outbox
from fleetwatch.server.tell.outbox import OutboxWorker, enqueue_report

SECRET = "hmac-key"


class Receiver:
    """A MockTransport handler that records requests and answers with ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, text="nope" if self.status >= 300 else "ok")

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def _worker(db: Database, settings: ServerSettings, receiver: Receiver) -> OutboxWorker:
    client = httpx.Client(transport=httpx.MockTransport(receiver))
    return OutboxWorker(
        db, settings, client=client, rng=lambda: 0.5, secrets=load_secret_box(settings)
    )


def _xid79(
    node: str, gpus: int = 2, *, boot_id: str = "boot-1", failing: int = 0
) -> dict[str, Any]:
    batch = make_batch(node, gpus=gpus, boot_id=boot_id)
    pci = batch["gpus"][failing]["pci_bus_id"]
    batch["events"] = [
        {
            "kind": "xid",
            "ts": datetime.now(UTC).isoformat(),
            "xid": 79,
            "pci_bus_id": pci,
            "message": f"NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus.",
        }
    ]
    return batch


def _judge(client: TestClient) -> Any:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    return state.alerter.run_once()


def _subscribe(client: TestClient, tokens: dict[str, str], **body: Any) -> dict[str, Any]:
    sent = {
        "name": "ops",
        "kind": "generic",
        "url": "http://receiver.test/hook",
        "secret": SECRET,
        **body,
    }
    response = client.post("/v1/webhooks", json=sent, headers=bearer(tokens["admin"]))
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    return made


def _outbox(db: Database) -> list[Any]:
    with db.read() as conn:
        return list(conn.execute(select(webhook_outbox).order_by(webhook_outbox.c.id)))


def test_xid79_fires_one_signed_alert_counts_repeats_and_resolves_on_reboot(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push, settings: ServerSettings
) -> None:
    _subscribe(client, tokens)
    receiver = Receiver()
    worker = _worker(db, settings, receiver)
    batch = _xid79("node-a")
    assert push(batch).status_code == 200
    assert _judge(client).fired == 1
    assert worker.run_once().delivered == 1
    [request] = receiver.requests
    assert verify_signature(
        SECRET,
        request.headers["X-FleetWatch-Timestamp"],
        request.content,
        request.headers["X-FleetWatch-Signature"],
    )
    alert = json.loads(request.content)["alert"]
    failing = batch["gpus"][0]
    assert (alert["node"], alert["gpu_index"], alert["gpu_uuid"]) == ("node-a", 0, failing["uuid"])
    assert (alert["serial"], alert["slot"]) == (failing["serial"], failing["pci_bus_id"])
    assert alert["cluster"] == "test" and alert["severity"] == "fatal"
    assert alert["action"] == "reboot_node" and alert["evidence"]["xids"] == [79]
    assert request.headers["Idempotency-Key"] == json.loads(request.content)["idempotency_key"]
    # A flood of the same Xid is the same alert: occurrences grow, nothing new is sent.
    for _ in range(3):
        assert push(_xid79("node-a")).status_code == 200
        assert _judge(client).fired == 0
    assert worker.run_once().claimed == 0
    firing = client.get("/v1/alerts?state=firing", headers=bearer(tokens["read"])).json()
    assert firing["count"] == 1 and firing["data"][0]["occurrences"] == 4
    # The node reboots: Xid 79's verdict clears and the alert resolves.
    assert push(make_batch("node-a", gpus=2, boot_id="boot-2")).status_code == 200
    assert _judge(client).resolved == 1
    assert worker.run_once().delivered == 1
    resolved = json.loads(receiver.requests[-1].content)
    assert resolved["event"] == "resolve" and resolved["alert"]["state"] == "resolved"
    assert resolved["alert"]["id"] == alert["id"]


def test_an_xid_storm_over_many_nodes_is_one_delivery_per_subscription(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push, settings: ServerSettings
) -> None:
    _subscribe(client, tokens, name="generic")
    _subscribe(client, tokens, name="pd", kind="pagerduty", secret="routing-key")
    receiver = Receiver()
    for n in range(25):
        assert push(_xid79(f"node-{n:02d}", gpus=1)).status_code == 200
    assert _judge(client).fired == 25
    assert _worker(db, settings, receiver).run_once().delivered == 2
    generic, pagerduty = sorted(receiver.bodies(), key=lambda b: "routing_key" in b)
    assert generic["count"] == 25 and len(generic["alerts"]) == 25
    assert pagerduty["event_action"] == "trigger" and pagerduty["payload"]["severity"] == "critical"
    assert pagerduty["payload"]["custom_details"]["count"] == 25
    # All 25 nodes reboot: one grouped resolve each, PagerDuty's on the group's dedup key.
    for n in range(25):
        assert push(make_batch(f"node-{n:02d}", gpus=1, boot_id="boot-2")).status_code == 200
    assert _judge(client).resolved == 25
    receiver.requests.clear()
    assert _worker(db, settings, receiver).run_once().delivered == 2
    generic_r, pagerduty_r = sorted(receiver.bodies(), key=lambda b: "routing_key" in b)
    assert generic_r["event"] == "resolve" and generic_r["count"] == 25
    assert pagerduty_r["event_action"] == "resolve"
    assert pagerduty_r["dedup_key"] == pagerduty["dedup_key"]


def test_subscription_filters_pick_what_each_receives(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push, settings: ServerSettings
) -> None:
    _subscribe(client, tokens, name="other-cluster", filters={"clusters": ["b"]})
    _subscribe(client, tokens, name="fatal-only", filters={"min_severity": "fatal"})
    _subscribe(client, tokens, name="unreachable-only", filters={"kinds": ["unreachable"]})
    _subscribe(client, tokens, name="this-cluster", filters={"clusters": ["test"]})
    assert push(_xid79("node-a")).status_code == 200
    _judge(client)
    hooks = {
        h["id"]: h["name"]
        for h in client.get("/v1/webhooks", headers=bearer(tokens["admin"])).json()["data"]
    }
    got = sorted(hooks[row.subscription_id] for row in _outbox(db))
    assert got == ["fatal-only", "this-cluster"]


def test_failed_deliveries_back_off_then_go_dead_with_the_error(
    client: TestClient, db: Database, tokens: dict[str, str], settings: ServerSettings
) -> None:
    hook = _subscribe(client, tokens)
    queued = client.post(f"/v1/webhooks/{hook['id']}/test", headers=bearer(tokens["admin"]))
    assert queued.status_code == 202, queued.text
    receiver = Receiver(status=503)
    worker = _worker(db, settings.model_copy(update={"webhook_max_attempts": 3}), receiver)
    now = datetime.now(UTC)
    assert worker.run_once(now).retried == 1
    [row] = _outbox(db)
    assert row.attempts == 1 and row.state == "pending" and "HTTP 503" in row.last_error
    assert row.next_attempt_at == now + timedelta(seconds=1)  # 1 s, jitter pinned at the middle
    assert worker.run_once(now + timedelta(seconds=0.5)).claimed == 0  # not due yet
    assert worker.run_once(now + timedelta(seconds=1)).retried == 1
    [row] = _outbox(db)
    assert row.next_attempt_at == now + timedelta(seconds=1 + 2)
    assert worker.run_once(now + timedelta(seconds=3)).dead == 1
    [row] = _outbox(db)
    assert (row.state, row.attempts) == ("dead", 3)
    deliveries = client.get(
        f"/v1/webhooks/{hook['id']}/deliveries?state=dead", headers=bearer(tokens["admin"])
    ).json()
    assert deliveries["count"] == 1 and "503" in deliveries["data"][0]["last_error"]
    assert len(receiver.requests) == 3
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1


def test_a_delivery_survives_a_restart_of_the_server(
    settings: ServerSettings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(settings)) as first:
        _subscribe(first, tokens)
        first_db: Database = first.app.state.db  # type: ignore[attr-defined]
        first.post("/v1/ingest", json=_xid79("node-a"), headers=bearer(tokens["agent"]))
        _judge(first)
        down = Receiver(status=500)
        assert _worker(first_db, settings, down).run_once().retried == 1
    # A new process on the same database: the pending delivery is still there and goes out.
    with TestClient(create_app(settings)) as second:
        second_db: Database = second.app.state.db  # type: ignore[attr-defined]
        up = Receiver()
        later = datetime.now(UTC) + timedelta(seconds=5)
        assert _worker(second_db, settings, up).run_once(later).delivered == 1
        [row] = _outbox(second_db)
        assert (row.state, row.attempts) == ("delivered", 2)
        assert json.loads(up.requests[0].content)["alert"]["node"] == "node-a"


def test_two_workers_never_send_the_same_delivery_twice_at_once(
    client: TestClient, db: Database, tokens: dict[str, str], settings: ServerSettings
) -> None:
    hook = _subscribe(client, tokens)
    for _ in range(5):
        client.post(f"/v1/webhooks/{hook['id']}/test", headers=bearer(tokens["admin"]))
    first, second = Receiver(), Receiver()
    now = datetime.now(UTC)
    claimed_first = _worker(db, settings, first)._claim(now)
    claimed_second = _worker(db, settings, second)._claim(now)
    assert len(claimed_first) == 5 and claimed_second == []


def test_webhook_api_validates_hides_secrets_and_removes(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    admin = bearer(tokens["admin"])
    bad: Callable[..., httpx.Response] = lambda **b: client.post(  # noqa: E731
        "/v1/webhooks",
        json={"name": "x", "kind": "generic", "url": "http://r.test", **b},
        headers=admin,
    )
    for body, field in (
        ({"url": "ftp://r.test"}, "url"),
        ({"kind": "email"}, "kind"),
        ({"kind": "pagerduty"}, "secret"),
    ):
        response = bad(**body)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"][-1] == field
    hook = _subscribe(client, tokens)
    assert (
        client.post(
            "/v1/webhooks",
            json={"name": "ops", "kind": "generic", "url": "http://r.test"},
            headers=admin,
        ).status_code
        == 409
    )
    listed = client.get("/v1/webhooks", headers=admin)
    assert SECRET not in listed.text and listed.json()["data"][0]["has_secret"] is True
    client.post(f"/v1/webhooks/{hook['id']}/test", headers=admin)
    assert client.delete(f"/v1/webhooks/{hook['id']}", headers=admin).status_code == 200
    assert _outbox(db) == []
    assert client.delete(f"/v1/webhooks/{hook['id']}", headers=admin).status_code == 404


def test_weekly_report_goes_to_subscriptions_that_asked_for_it(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    wants = _subscribe(client, tokens, name="weekly", filters={"weekly_report": True})
    _subscribe(client, tokens, name="alerts-only")
    now = datetime.now(UTC)
    with db.write() as conn:
        assert enqueue_report(conn, key="2026-W09", payload={"summary": "ok"}, now=now) == 1
        assert enqueue_report(conn, key="2026-W09", payload={"summary": "ok"}, now=now) == 0
    [row] = _outbox(db)
    assert row.subscription_id == wants["id"] and row.event == "report"


def test_unreachable_node_alert_fires_and_resolves(
    client: TestClient, db: Database, tokens: dict[str, str], push: Push
) -> None:
    _subscribe(client, tokens, filters={"kinds": ["unreachable"]})
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    alerter = client.app.state.alerter  # type: ignore[attr-defined]
    assert alerter.run_once().fired == 0
    assert alerter.run_once(datetime.now(UTC) + timedelta(minutes=2)).fired == 1
    [row] = _outbox(db)
    assert row.payload["alerts"][0]["dedup_key"] == "node:node-q:unreachable"
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    assert alerter.run_once().resolved == 0  # no assessment yet: nothing resolves
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    assert alerter.run_once().resolved == 1


def test_webhook_cli_adds_lists_tests_and_removes(
    client: TestClient, tokens: dict[str, str], monkeypatch: Any
) -> None:
    from click.testing import CliRunner

    from fleetwatch.cli import main

    def through_app(method: str, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        # The CLI verifies the server's certificate by default (no CA bundle: the public roots).
        assert kwargs.pop("verify") is True
        return client.request(method, url.removeprefix("http://fw.test"), **kwargs)

    monkeypatch.setattr(httpx, "request", through_app)
    runner = CliRunner()
    common = ["--server", "http://fw.test", "--token", tokens["admin"]]
    added = runner.invoke(
        main,
        [
            "webhook",
            "add",
            "pd",
            "--kind",
            "pagerduty",
            "--url",
            PD_URL,
            "--secret",
            "rk",
            "--cluster",
            "a",
            *common,
        ],
    )
    assert added.exit_code == 0 and "added" in added.output, added.output
    listed = runner.invoke(main, ["webhook", "list", *common])
    assert "pagerduty" in listed.output and "clusters=['a']" in listed.output
    hook_id = listed.output.split()[0]
    tested = runner.invoke(main, ["webhook", "test", hook_id, *common])
    assert "queued" in tested.output, tested.output
    missing = runner.invoke(
        main, ["webhook", "add", "pd2", "--kind", "pagerduty", "--url", PD_URL, *common]
    )
    assert missing.exit_code != 0 and "secret" in missing.output
    removed = runner.invoke(main, ["webhook", "remove", hook_id, *common])
    assert removed.exit_code == 0 and "removed" in removed.output


PD_URL = "https://events.pagerduty.com/v2/enqueue"
