"""Webhooks from a real server process: a local signed receiver and a real Alertmanager.

An Xid 79 pushed over HTTP becomes, through the background jobs alone (assessment, alerts,
delivery), a signed generic webhook and an active Alertmanager alert; the node's reboot resolves
both.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_SECRET_KEY, require_tool
from tests.factories import make_batch
from tests.integration.live import create_token, fleetwatch, free_port, live_server
from tests.integration.receiver import WebhookReceiver, webhook_receiver

SECRET = "live-secret"


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver(SECRET) as receiver:
        yield receiver


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    binary = require_tool("prometheus-alertmanager")
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        'route:\n  receiver: "null"\n  group_wait: 1s\nreceivers:\n  - name: "null"\n'
    )
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ready = _until(lambda: _get(f"{url}/-/ready"), lambda r: r == 200, timeout=20)
        assert ready == 200, (tmp_path / "alertmanager.log").read_text()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


def _until(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    value = read()
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value


def _am_alerts(url: str, node: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
    return [a for a in found if a["labels"].get("node") == node]


def _generic(receiver: WebhookReceiver, event: str) -> list[dict[str, Any]]:
    out = []
    for delivery in receiver.events(event):
        assert delivery.signed, delivery  # signed with SECRET
        out.append(delivery.doc)
    return out


def test_xid79_pages_a_signed_webhook_and_alertmanager_and_the_reboot_resolves_both(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: WebhookReceiver,
    alertmanager: str,
) -> None:
    if database_url.startswith("sqlite"):
        fleetwatch("db", "upgrade", "--database-url", database_url)
    for name, value in {
        "ASSESS_INTERVAL_S": "0.5",
        "ALERT_INTERVAL_S": "0.5",
        "WEBHOOK_DELIVERY_INTERVAL_S": "0.2",
        "ALERTMANAGER_REPEAT_S": "5",
        "PLANNER_INTERVAL_S": "60",
        "REFIT_INTERVAL_S": "0",
        "SECRET_KEYS": TEST_SECRET_KEY,
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    agent, admin = create_token(database_url, "agent"), create_token(database_url, "admin")
    with live_server(database_url, tmp_path) as server, server.client(agent) as push:
        for args in (
            ("ops", "--kind", "generic", "--url", receiver.url, "--secret", SECRET),
            ("am", "--kind", "alertmanager", "--url", alertmanager),
        ):
            out = fleetwatch("webhook", "add", *args, "--server", server.url, "--token", admin)
            assert "added" in out
        listed = fleetwatch("webhook", "list", "--server", server.url, "--token", admin)
        assert "ops" in listed and SECRET not in listed
        batch = make_batch("node-live", gpus=2, ticks=2)
        pci = batch["gpus"][1]["pci_bus_id"]
        batch["events"] = [
            {
                "kind": "xid",
                "ts": datetime.now(UTC).isoformat(),
                "xid": 79,
                "pci_bus_id": pci,
                "message": f"NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus.",
            }
        ]
        assert push.post("/v1/ingest", json=batch).is_success
        triggers = _until(lambda: _generic(receiver, "trigger"), lambda t: len(t) >= 1)
        assert len(triggers) == 1, receiver.received
        alert = triggers[0]["alert"]
        assert (alert["node"], alert["gpu_index"], alert["slot"]) == ("node-live", 1, pci)
        assert alert["severity"] == "fatal" and alert["action"] == "reboot_node"
        active = _until(lambda: _am_alerts(alertmanager, "node-live"), lambda a: len(a) == 1)
        assert len(active) == 1 and active[0]["status"]["state"] == "active", active
        assert active[0]["labels"]["gpu"] == "1" and active[0]["labels"]["severity"] == "fatal"
        assert active[0]["annotations"]["action"] == "reboot_node"
        # The node reboots: a batch with a new boot id clears Xid 79's verdict.
        time.sleep(1.0)
        assert push.post(
            "/v1/ingest", json=make_batch("node-live", gpus=2, boot_id="boot-2")
        ).is_success
        resolves = _until(lambda: _generic(receiver, "resolve"), lambda r: len(r) >= 1)
        assert len(resolves) == 1 and resolves[0]["alert"]["id"] == alert["id"]
        assert resolves[0]["alert"]["state"] == "resolved"
        gone = _until(lambda: _am_alerts(alertmanager, "node-live"), lambda a: not a)
        assert gone == [], gone
        # Repeats of the firing alert never reached the generic receiver twice.
        assert len(_generic(receiver, "trigger")) == 1
