"""/metrics after a known batch: exact lines, base units, absent fields, valid exposition format.

Per-GPU series and node detail are on the shard pages (here the one shard of ``shards=1``, which
holds every node); node state, the fleet's counters and the process's own are on the default page.
"""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push

from fleetwatch.metrics import GPU_METRICS, THROTTLE_REASONS

MODEL = "NVIDIA H100 80GB HBM3"
GPU0, GPU1 = gpu_uuid("node-a", 0), gpu_uuid("node-a", 1)
# Reasons sw_power_cap (0x4) and hw_thermal_slowdown (0x40).
REASONS = 0x44


# The one shard of one: every node's per-GPU series in one page.
WHOLE_FLEET = {"shard": "0", "shards": "1"}


def _labels(index: int, uuid: str) -> str:
    return f'node="node-a",gpu="{index}",uuid="{uuid}",model="{MODEL}"'


@pytest.fixture
def known(push: Push) -> dict[str, Any]:
    """node-a: GPU 0 reports a full sample and one Xid 79; GPU 1 reports only its temperature."""
    batch = make_batch("node-a", gpus=2, labels={"rack": "r12"})
    batch["samples"][0]["clocks_event_reasons"] = REASONS
    assert "fan_speed_pct" not in batch["samples"][0]
    batch["samples"][1] = {
        "uuid": GPU1,
        "ts": batch["samples"][1]["ts"],
        "gpu_temp_c": 38.5,
    }
    batch["events"] = [
        {"kind": "xid", "uuid": GPU0, "xid": 79, "ts": datetime.now(UTC).isoformat()}
    ]
    response = push(batch)
    assert response.status_code == 200, response.text
    return batch


@pytest.fixture
def scrape(client: TestClient, tokens: dict[str, str]) -> Callable[..., httpx.Response]:
    def _scrape(params: dict[str, str] | None = None, **headers: str) -> httpx.Response:
        sent = {**bearer(tokens["read"]), **headers}
        response = client.get("/metrics", params=params, headers=sent)
        assert response.status_code == 200, response.text
        return response

    return _scrape


def _lines(response: httpx.Response) -> list[str]:
    return response.text.splitlines()


def test_metrics_gpu_gauges_have_exact_lines(known: dict[str, Any], scrape: Any) -> None:
    lines = _lines(scrape(WHOLE_FLEET))
    full = _labels(0, GPU0)
    for expected in [
        f"fleetwatch_gpu_temperature_celsius{{{full}}} 41.0",
        f"fleetwatch_gpu_temperature_celsius{{{_labels(1, GPU1)}}} 38.5",
        f"fleetwatch_gpu_power_watts{{{full}}} 312.5",
        # Base units: MHz -> Hz, percent -> ratio, MiB -> bytes, mJ -> J.
        f"fleetwatch_gpu_sm_clock_hertz{{{full}}} 1980000000.0",
        f"fleetwatch_gpu_memory_clock_hertz{{{full}}} 2619000000.0",
        f"fleetwatch_gpu_utilization_ratio{{{full}}} 0.97",
        f"fleetwatch_gpu_framebuffer_used_bytes{{{full}}} {60_000 * 1024 * 1024}.0",
        f"fleetwatch_gpu_energy_joules_total{{{full}}} 123456.789",
        # Counters end in _total; zero is a reading and is exported.
        f"fleetwatch_gpu_ecc_dbe_volatile_errors_total{{{full}}} 0",
        f"fleetwatch_gpu_pcie_replays_total{{{full}}} 0",
        # Flags as 0/1.
        f"fleetwatch_gpu_remapped_rows_pending{{{full}}} 0",
        f"fleetwatch_gpu_clocks_event_reasons{{{full}}} {REASONS}",
    ]:
        assert expected in lines, f"missing line: {expected}"


def test_metrics_gpu_info_carries_identity(known: dict[str, Any], scrape: Any) -> None:
    gpu = known["gpus"][0]
    expected = (
        f'fleetwatch_gpu_info{{{_labels(0, GPU0)},serial="{gpu["serial"]}",'
        f'driver_version="550.90.07",pci_bus_id="0000:18:00.0"}} 1'
    )
    assert expected in _lines(scrape(WHOLE_FLEET))
    assert not [line for line in _lines(scrape()) if line.startswith("fleetwatch_gpu_info")]


def test_metrics_clocks_event_active_per_reason(known: dict[str, Any], scrape: Any) -> None:
    lines = _lines(scrape(WHOLE_FLEET))
    full = _labels(0, GPU0)
    for reason, bit in THROTTLE_REASONS:
        value = 1 if REASONS & bit else 0
        assert f'fleetwatch_gpu_clocks_event_active{{{full},reason="{reason}"}} {value}' in lines
    active = [line for line in lines if line.startswith("fleetwatch_gpu_clocks_event_active{")]
    assert sorted(
        line.split('reason="')[1].split('"')[0] for line in active if line.endswith(" 1")
    ) == [
        "hw_thermal_slowdown",
        "sw_power_cap",
    ]


def test_metrics_unreported_field_has_no_line(known: dict[str, Any], scrape: Any) -> None:
    lines = _lines(scrape(WHOLE_FLEET))
    gpu1 = [line for line in lines if f'uuid="{GPU1}"' in line and not line.startswith("#")]
    # GPU 1 reported its temperature only: that line, its identity and sample time, nothing else.
    names = sorted(line.split("{")[0] for line in gpu1)
    assert names == [
        "fleetwatch_gpu_info",
        "fleetwatch_gpu_last_sample_timestamp_seconds",
        "fleetwatch_gpu_temperature_celsius",
    ]
    # Nobody reported the fan: no family at all, not a zero.
    assert not [line for line in lines if "fleetwatch_gpu_fan_speed_ratio" in line]
    assert not any(
        line.startswith("fleetwatch_gpu_clocks_event_active{") and GPU1 in line for line in lines
    )


def test_metrics_xid_events_counted(known: dict[str, Any], scrape: Any) -> None:
    lines = _lines(scrape(WHOLE_FLEET))
    assert f'fleetwatch_xid_events_total{{node="node-a",gpu="0",uuid="{GPU0}",xid="79"}} 1' in lines
    assert 'fleetwatch_events_total{node="node-a",kind="xid"} 1' in lines
    fleet = _lines(scrape())
    assert 'fleetwatch_fleet_xid_events_total{xid="79"} 1' in fleet
    assert 'fleetwatch_fleet_events_total{kind="xid"} 1' in fleet


def test_metrics_xid_count_grows_with_new_events(
    known: dict[str, Any], push: Push, scrape: Any
) -> None:
    scrape()  # warm the cache first: new events must be followed incrementally
    later = make_batch("node-a", gpus=2)
    now = datetime.now(UTC)
    later["events"] = [
        {"kind": "xid", "uuid": GPU0, "xid": 79, "ts": now.isoformat()},
        {"kind": "xid", "uuid": GPU1, "xid": 48, "ts": (now - timedelta(seconds=1)).isoformat()},
    ]
    assert push(later).status_code == 200
    lines = _lines(scrape(WHOLE_FLEET))
    assert f'fleetwatch_xid_events_total{{node="node-a",gpu="0",uuid="{GPU0}",xid="79"}} 2' in lines
    assert f'fleetwatch_xid_events_total{{node="node-a",gpu="1",uuid="{GPU1}",xid="48"}} 1' in lines
    fleet = _lines(scrape())
    assert 'fleetwatch_fleet_xid_events_total{xid="48"} 1' in fleet
    assert 'fleetwatch_fleet_xid_events_total{xid="79"} 2' in fleet
    assert 'fleetwatch_fleet_events_total{kind="xid"} 3' in fleet


def test_metrics_node_lines(known: dict[str, Any], scrape: Any) -> None:
    lines = _lines(scrape())
    assert 'fleetwatch_node_up{node="node-a"} 1' in lines
    assert 'fleetwatch_nodes{state="up"} 1' in lines
    assert 'fleetwatch_nodes{state="unreachable"} 0' in lines
    detail = _lines(scrape(WHOLE_FLEET))
    assert 'fleetwatch_node_info{node="node-a",rack="r12"} 1' in detail
    stamp = next(x for x in detail if x.startswith("fleetwatch_node_last_seen_timestamp_seconds{"))
    assert stamp.startswith('fleetwatch_node_last_seen_timestamp_seconds{node="node-a"} ')
    # Heard when the batch arrived: after it was built, before this scrape.
    built = datetime.fromisoformat(known["samples"][0]["ts"]).timestamp()
    assert built <= float(stamp.split()[1]) <= datetime.now(UTC).timestamp()


def test_metrics_ingest_counters_and_latency(
    known: dict[str, Any], push: Push, scrape: Any
) -> None:
    assert push(known).json()["duplicate"] is True
    bad = make_batch("node-a", gpus=1)
    bad["samples"][0]["gpu_temp_c"] = "hot"
    assert push(bad).status_code == 422

    families = {f.name: f for f in text_string_to_metric_families(scrape().text)}

    def value(family: str, sample: str, **labels: str) -> float:
        found = [
            s.value for s in families[family].samples if s.name == sample and s.labels == labels
        ]
        assert len(found) == 1, (family, sample, labels, families[family].samples)
        return found[0]

    batches = "fleetwatch_ingest_batches"
    assert value(batches, f"{batches}_total", outcome="accepted") == 1
    assert value(batches, f"{batches}_total", outcome="duplicate") == 1
    assert value(batches, f"{batches}_total", outcome="rejected") == 1
    rejections = "fleetwatch_ingest_rejections"
    assert value(rejections, f"{rejections}_total", status="422") == 1
    assert value("fleetwatch_ingest_samples", "fleetwatch_ingest_samples_total") == 2
    assert value("fleetwatch_ingest_events", "fleetwatch_ingest_events_total") == 1

    latency = "fleetwatch_ingest_request_duration_seconds"
    assert families[latency].type == "histogram"
    # Accepted and duplicate requests are timed; the rejected one is not.
    assert value(latency, f"{latency}_count") == 2
    assert value(latency, f"{latency}_bucket", le="+Inf") == 2
    assert value(latency, f"{latency}_sum") > 0


def _families(text: str) -> dict[str, Any]:
    """The page's families by name, after checking that none is declared twice (Prometheus
    refuses a page with a repeated TYPE line) and that counter samples end in _total."""
    types = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    assert [name for name, n in types.items() if n > 1] == []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for family in families.values():
        if family.type == "counter":
            assert all(s.name != family.name for s in family.samples), family.name
    return families


def test_metrics_text_is_valid_exposition_format(known: dict[str, Any], scrape: Any) -> None:
    for page in ({}, WHOLE_FLEET, {"shard": "1", "shards": "3"}):
        response = scrape(page)
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        _families(response.text)
    fleet = _families(scrape().text)
    assert fleet["fleetwatch_node_up"].type == "gauge"
    assert fleet["fleetwatch_fleet_xid_events"].type == "counter"
    by_name = _families(scrape(WHOLE_FLEET).text)
    assert by_name["fleetwatch_gpu_temperature_celsius"].type == "gauge"
    assert by_name["fleetwatch_gpu_energy_joules"].type == "counter"
    assert by_name["fleetwatch_xid_events"].type == "counter"
    # Every per-GPU metric that was reported parses with its declared type.
    reported = {
        spec.name.removesuffix("_total"): spec.type
        for spec in GPU_METRICS
        if spec.field in known["samples"][0]
    }
    assert reported
    for name, kind in reported.items():
        assert by_name[name].type == kind, name


def test_metrics_gzip_when_asked(
    known: dict[str, Any], client: TestClient, tokens: dict[str, str]
) -> None:
    headers = {**bearer(tokens["read"]), "Accept-Encoding": "gzip"}
    for params, wanted in [
        (WHOLE_FLEET, f"fleetwatch_gpu_temperature_celsius{{{_labels(0, GPU0)}}} 41.0"),
        ({}, 'fleetwatch_node_up{node="node-a"} 1'),
    ]:
        with client.stream("GET", "/metrics", params=params, headers=headers) as zipped:
            assert zipped.headers["content-encoding"] == "gzip"
            raw = b"".join(zipped.iter_raw())
        text = gzip.decompress(raw).decode()
        assert wanted in text.splitlines()
        list(text_string_to_metric_families(text))

    plain = client.get("/metrics", headers={**headers, "Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert "fleetwatch_node_up" in plain.text


def test_metrics_escape_label_values(push: Push, scrape: Any) -> None:
    batch = make_batch("node-q", gpus=1, labels={"rack": 'r"1\\x'})
    batch["gpus"][0]["name"] = 'GPU "quoted"'
    assert push(batch).status_code == 200
    text = scrape(WHOLE_FLEET).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    temps = [
        s
        for s in families["fleetwatch_gpu_temperature_celsius"].samples
        if s.labels["node"] == "node-q"
    ]
    assert [s.labels["model"] for s in temps] == ['GPU "quoted"']
    info = [s for s in families["fleetwatch_node_info"].samples if s.labels["node"] == "node-q"]
    assert info[0].labels["rack"] == 'r"1\\x'


def test_metrics_without_fleet_still_parses(scrape: Any) -> None:
    text = scrape().text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"fleetwatch_node_up", "fleetwatch_ingest_batches"} <= names
    assert "fleetwatch_gpu_temperature_celsius" not in names
    assert list(text_string_to_metric_families(scrape(WHOLE_FLEET).text)) == []
