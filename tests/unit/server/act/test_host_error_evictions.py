"""Host errors (NVSwitch SXid, PCIe AER) from ingest to GET /v1/evictions, both databases.

The events are real kernel-log records read with the agent's parsers, put on the wire as the
agent sends them. Assessment and planning are driven by hand, as in test_planner; the urgent
wake-up is checked on the ingest route itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_events import parse_kernel_events
from fleetwatch.server.routers import urgent_lane

CAPTURES = Path(__file__).resolve().parents[3] / "fixtures" / "kernel_log_captures"
SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "fixtures"
SXID_LOG = SHARED / "nvswitch_fabric" / "gpud__dmesg_Xid79-with-SXid20034-LTSSM-multi-switch.log"
FM_LOG = (
    SHARED / "nvswitch_fabric" / "gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
)
AER_LOG = CAPTURES / "lkml-2024-01-11_aer-corrected-nonfatalerr_fatal-tlp-malftlp.log"
MCE_LOG = CAPTURES / "lkml-2025-11-07_mce-exception-pcc-panic_indented.log"
AER_GPU = "0000:b7:02.0"  # the record's device; the test node's GPU 1 sits there


def _parsed(path: Path, kind: str, severity: str) -> list[KernelEvent]:
    if not path.is_file():
        pytest.skip(f"fixture not found: {path}")
    events = parse_kernel_events(path.read_text(errors="replace"), year_hint=2024).events
    return [e for e in events if e.kind == kind and (e.details or {}).get("severity") == severity]


def _wire(events: list[KernelEvent], **overrides: Any) -> list[dict[str, Any]]:
    """As the agent sends them, stamped five minutes ago (dmesg captures carry no date)."""
    ts = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    return [
        {"kind": e.kind, "ts": ts, "pci_bus_id": e.pci_bus_id, "message": e.message,
         "details": e.details, **overrides}
        for e in events
    ]  # fmt: skip


def _batch(node: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    batch = make_batch(node, gpus=2, ticks=3)
    batch["gpus"][1]["pci_bus_id"] = AER_GPU
    batch["events"] = events
    return batch


def _plan(client: TestClient) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    state.planner.run_once()


def _evictions(client: TestClient, tokens: dict[str, str]) -> list[dict[str, Any]]:
    response = client.get("/v1/evictions", headers=bearer(tokens["scheduler"]))
    assert response.status_code == 200
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def _verdicts(eviction: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for g in eviction["evidence"]["gpus"] for v in g["verdicts"]]


def test_fatal_sxid_becomes_a_pending_eviction_of_its_node(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    sxids = _wire(_parsed(SXID_LOG, "sxid", "fatal"))
    assert push(_batch("node-s", sxids)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    _plan(client)
    [eviction] = _evictions(client, tokens)
    assert (eviction["node"], eviction["state"]) == ("node-s", "pending")
    assert eviction["reason_kind"] == "rule" and eviction["reason"].startswith("sxid_fatal")
    # A node verdict: every GPU of the node leaves with the fabric.
    assert {g["uuid"] for g in eviction["evidence"]["gpus"]} == {
        gpu_uuid("node-s", 0), gpu_uuid("node-s", 1)
    }  # fmt: skip
    fatal = [v for v in _verdicts(eviction) if v["rule"] == "sxid_fatal"]
    assert fatal and all(v["kind"] == "host" and v["severity"] == "fatal" for v in fatal)
    links = {link for v in fatal for link in v["evidence"]["links"]}
    assert {v["evidence"]["sxids"][0] for v in fatal} == {20034} and {48, 63} <= links


def test_uncorrected_aer_on_a_gpu_becomes_a_pending_eviction_naming_that_gpu(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    aer = _wire(_parsed(AER_LOG, "pcie_aer", "fatal"))
    assert aer[0]["pci_bus_id"] == AER_GPU
    assert push(_batch("node-p", aer)).status_code == 200
    _plan(client)
    [eviction] = _evictions(client, tokens)
    assert eviction["node"] == "node-p" and "GPU 1" in eviction["reason"]
    [gpu] = eviction["evidence"]["gpus"]
    assert gpu["uuid"] == gpu_uuid("node-p", 1)
    [verdict] = gpu["verdicts"]
    assert (verdict["rule"], verdict["action"]) == ("aer_gpu_uncorrected", "drain_reset")
    assert verdict["evidence"]["errors"] == ["TLP", "MalfTLP"]


def test_corrected_aer_and_a_non_fatal_sxid_drain_nothing(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    lesser = _wire(_parsed(AER_LOG, "pcie_aer", "corrected")) + _wire(
        _parsed(FM_LOG, "sxid", "non_fatal")
    )
    assert len(lesser) == 2
    assert push(_batch("node-q", lesser)).status_code == 200
    _plan(client)
    assert _evictions(client, tokens) == []


def test_host_verdicts_show_in_the_risk_api_with_kind_host(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    assert push(_batch("node-r", _wire(_parsed(AER_LOG, "pcie_aer", "fatal")))).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    uuid = gpu_uuid("node-r", 1)
    response = client.get(f"/v1/gpus/{uuid}/risk", headers=bearer(tokens["read"]))
    assert response.status_code == 200, response.text
    [verdict] = response.json()["verdicts"]
    assert verdict["kind"] == "host" and verdict["takes_gpu_out"] is True
    assert verdict["evidence"]["scope"] == "gpu"


@pytest.mark.parametrize(
    ("path", "kind", "severity", "urgent"),
    [(SXID_LOG, "sxid", "fatal", True), (AER_LOG, "pcie_aer", "fatal", True),
     (AER_LOG, "pcie_aer", "corrected", False), (FM_LOG, "sxid", "non_fatal", False)],
)  # fmt: skip
def test_draining_host_errors_wake_the_planner_at_ingest(
    push: Push, monkeypatch: pytest.MonkeyPatch, path: Path, kind: str, severity: str, urgent: bool
) -> None:
    woken: list[object] = []
    monkeypatch.setattr(urgent_lane, "notify_wake", lambda engine, nodes=None: woken.append(engine))
    assert push(_batch("node-w", _wire(_parsed(path, kind, severity)))).status_code == 200
    assert len(woken) == (1 if urgent else 0)


def test_a_fatal_machine_check_is_one_node_alert_and_an_eviction(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    panic = _wire(_parsed(MCE_LOG, "mce", "fatal"))
    assert push(_batch("node-m", panic)).status_code == 200
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    # Given to both GPUs of the node, it is one fault: one alert, under the node's key.
    assert state.alerter.run_once().fired == 1
    firing = client.get("/v1/alerts?state=firing", headers=bearer(tokens["read"])).json()
    [alert] = firing["data"]
    assert alert["node"] == "node-m" and alert["severity"] == "fatal"
    assert alert["evidence"]["rule"] == "mce_uncorrected"
    assert alert["evidence"]["panic"] == ["Processor context corrupt"]
    state.planner.run_once()
    [eviction] = _evictions(client, tokens)
    assert eviction["node"] == "node-m" and eviction["reason"].startswith("mce_uncorrected")


def _verdict_rules(client: TestClient, tokens: dict[str, str], uuid: str) -> list[str]:
    response = client.get(f"/v1/gpus/{uuid}/risk", headers=bearer(tokens["read"]))
    assert response.status_code == 200, response.text
    return [v["rule"] for v in response.json()["verdicts"]]


def test_a_reboot_clears_the_fabric_verdict_but_not_the_machine_check(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    evs = _wire(_parsed(SXID_LOG, "sxid", "fatal")) + _wire(_parsed(MCE_LOG, "mce", "fatal"))
    assert push(_batch("node-x", evs)).status_code == 200
    assessor = client.app.state.assessor  # type: ignore[attr-defined]
    assessor.run_once()
    uuid = gpu_uuid("node-x", 0)
    assert set(_verdict_rules(client, tokens, uuid)) == {"sxid_fatal", "mce_uncorrected"}
    # The node boots again: the reset the SXid asked for happened; the CPU still needs a look.
    rebooted = make_batch("node-x", gpus=2, ticks=3, boot_id="boot-2")
    rebooted["gpus"][1]["pci_bus_id"] = AER_GPU
    assert push(rebooted).status_code == 200
    assessor.run_once()
    assert _verdict_rules(client, tokens, uuid) == ["mce_uncorrected"]


def test_a_node_verdict_is_one_node_series_on_metrics_not_one_per_gpu(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    """A fatal machine check is held by both GPUs of the node; /metrics shows it once, as
    ``fleetwatch_node_verdict``, so the node pages once (FleetWatchNodeFatalVerdict) and no GPU
    alert fires for it."""
    panic = _wire(_parsed(MCE_LOG, "mce", "fatal"))
    assert push(_batch("node-m", panic)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    page = client.get("/metrics", headers=bearer(tokens["read"])).text.splitlines()
    node_lines = [x for x in page if x.startswith("fleetwatch_node_verdict{")]
    assert node_lines == [
        'fleetwatch_node_verdict{node="node-m",kind="host",component="host",'
        'rule="mce_uncorrected",severity="fatal",action="drain_inspect"} 1'
    ]
    assert not [x for x in page if x.startswith("fleetwatch_gpu_verdict{")]
    assert 'fleetwatch_gpus{verdict="fatal"} 2' in page
