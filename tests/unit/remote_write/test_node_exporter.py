"""node_exporter's InfiniBand and EDAC series onto FleetWatch readings, checked against
node_exporter's own end-to-end output (tests/fixtures/node_exporter/README.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.event_details import MAX_EVENT_COUNT
from fleetwatch.remote_write.node_exporter import (
    EdacReading,
    NodeExporterReadings,
    Sample,
    edac_event,
    map_node_exporter,
)
from fleetwatch.rules.host_errors import judge_host_errors
from fleetwatch.telemetry import Event, PortSample

FIXTURE = (
    Path(__file__).parents[2] / "fixtures" / "node_exporter" / "e2e-output_infiniband_edac.prom"
)
TS = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def fixture_samples(ts: datetime = TS) -> list[Sample]:
    text = FIXTURE.read_text(encoding="utf-8")
    return [
        (s.name, s.labels, s.value, ts)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@pytest.fixture(scope="module")
def mapped() -> NodeExporterReadings:
    return map_node_exporter(fixture_samples())


def port(result: NodeExporterReadings, device: str, number: int) -> dict[str, object]:
    (found,) = [p for p in result.ports if p["device"] == device and p["port"] == number]
    return found


def one(name: str, value: float, ts: datetime = TS, **labels: str) -> Sample:
    labels = labels or {"device": "mlx5_0", "port": "1"}
    return (name, labels, value, ts)


def test_node_exporter_fixture_gives_one_reading_per_port(mapped: NodeExporterReadings) -> None:
    keys = [(p["device"], p["port"], p["ts"]) for p in mapped.ports]
    assert keys == [("i40iw0", 1, TS), ("mlx4_0", 1, TS), ("mlx4_0", 2, TS)]
    assert mapped.skipped == []


def test_node_exporter_mlx_port_link_from_the_fixture(mapped: NodeExporterReadings) -> None:
    mlx = port(mapped, "mlx4_0", 1)
    assert (mlx["state"], mlx["state_code"]) == ("ACTIVE", 4)
    assert (mlx["phys_state"], mlx["phys_state_code"]) == ("LinkUp", 5)
    # 5e+09 bytes/s in the fixture; sysfs said "40 Gb/sec (4X QDR)".
    assert mlx["rate_gbps"] == 5e9 * 8 / 1e9 == 40.0
    # "10 Gb/sec (4X)" -> 1.25e+09 bytes/s.
    assert port(mapped, "i40iw0", 1)["rate_gbps"] == 10.0


def test_node_exporter_mlx_port_counters_in_sysfs_names_and_units(
    mapped: NodeExporterReadings,
) -> None:
    counters = port(mapped, "mlx4_0", 1)["counters"]
    assert counters == {
        "link_downed": 0,
        "link_error_recovery": 0,
        "multicast_rcv_packets": 93,
        "multicast_xmit_packets": 16,
        "port_rcv_constraint_errors": 0,
        "port_xmit_constraint_errors": 0,
        # 1.8527668e+07 and 1.493376e+07 bytes: sysfs's own files read 4631917 and 3733440 words.
        "port_rcv_data": 4631917,
        "port_xmit_data": 3733440,
        "port_rcv_discards": 0,
        "port_xmit_discards": 5,
        "port_rcv_errors": 0,
        "port_rcv_packets": 6825908347,
        "port_xmit_packets": 6235865,
        "port_xmit_wait": 4294967295,
        "unicast_rcv_packets": 61148,
        "unicast_xmit_packets": 61239,
    }
    assert all(type(v) is int for v in counters.values())


def test_node_exporter_absent_fields_stay_absent(mapped: NodeExporterReadings) -> None:
    never_exported = {"link_layer", "node_guid", "netdev", "link_width", "link_speed"}
    for reading in mapped.ports:
        assert not never_exported & reading.keys()
        assert "hw_counters" not in reading  # the fixture's ports have no hw_counters/
    assert "counters" not in port(mapped, "i40iw0", 1)
    # mlx4_0 port 2 has only eight counter files in the sysfs fixture: no errors counter is 0.
    counters = port(mapped, "mlx4_0", 2)["counters"]
    assert isinstance(counters, dict)
    assert "symbol_error" not in counters and "port_rcv_errors" not in counters
    assert counters["port_rcv_data"] == 0 and len(counters) == 8


def test_node_exporter_every_port_reading_validates(mapped: NodeExporterReadings) -> None:
    for reading in mapped.ports:
        sample = PortSample.model_validate(reading)
        assert sample.model_dump(exclude_none=True) == reading


def test_node_exporter_edac_readings_from_the_fixture(mapped: NodeExporterReadings) -> None:
    got = {(r.controller, r.csrow, r.kind): r.value for r in mapped.edac}
    assert got == {
        (0, None, "corrected"): 1,
        (0, None, "uncorrected"): 5,
        (0, 0, "corrected"): 3,
        (0, 1, "corrected"): 0,
        (0, 2, "corrected"): 0,
        (0, "unknown", "corrected"): 2,
        (0, 0, "uncorrected"): 4,
        (0, 1, "uncorrected"): 4,
        (0, 2, "uncorrected"): 5,
        (0, "unknown", "uncorrected"): 6,
    }
    assert {r.ts for r in mapped.edac} == {TS}


def test_node_exporter_reports_series_it_does_not_map(mapped: NodeExporterReadings) -> None:
    legacy = {
        f"node_infiniband_legacy_{n}"
        for n in (
            "data_received_bytes_total",
            "data_transmitted_bytes_total",
            "multicast_packets_received_total",
            "multicast_packets_transmitted_total",
            "packets_received_total",
            "packets_transmitted_total",
            "unicast_packets_received_total",
            "unicast_packets_transmitted_total",
        )
    }
    assert mapped.unrecognised == legacy | {
        "node_infiniband_info",
        "node_edac_channel_correctable_errors_total",
        "node_edac_channel_uncorrectable_errors_total",
    }
    assert {
        "node_infiniband_state_id",
        "node_infiniband_rate_bytes_per_second",
        "node_edac_csrow_uncorrectable_errors_total",
        "node_edac_correctable_errors_total",
    } <= mapped.recognised
    assert not mapped.recognised & mapped.unrecognised
    foreign = map_node_exporter([one("node_cpu_seconds_total", 3.0, cpu="0", mode="idle")])
    assert foreign.unrecognised == {"node_cpu_seconds_total"}
    assert foreign.ports == [] and foreign.edac == []


@pytest.mark.parametrize(
    ("code", "name"),
    [(0, "NOP"), (1, "DOWN"), (2, "INIT"), (3, "ARMED"), (5, "ACTIVE_DEFER"), (6, "UNKNOWN")],
)
def test_node_exporter_state_names_as_sysfs_prints_them(code: int, name: str) -> None:
    (reading,) = map_node_exporter([one("node_infiniband_state_id", code)]).ports
    assert (reading["state"], reading["state_code"]) == (name, code)


@pytest.mark.parametrize(
    ("code", "name"),
    [(1, "Sleep"), (2, "Polling"), (3, "Disabled"), (4, "PortConfigurationTraining"),
     (6, "LinkErrorRecovery"), (7, "Phy Test"), (0, None), (9, None)],
)  # fmt: skip
def test_node_exporter_physical_state_names(code: int, name: str | None) -> None:
    (reading,) = map_node_exporter([one("node_infiniband_physical_state_id", code)]).ports
    assert reading["phys_state_code"] == code
    assert reading.get("phys_state") == name  # sysfs's "<unknown>" cannot be sent: no name
    PortSample.model_validate(reading)


def test_node_exporter_hw_counters_and_counter_names_follow_sysfs() -> None:
    result = map_node_exporter(
        [
            one("node_infiniband_roce_adp_retransmits_total", 12),
            one("node_infiniband_local_ack_timeout_errors_total", 3),
            one("node_infiniband_vl15_dropped_total", 2),
            one("node_infiniband_symbol_error_total", 7),
            one("node_infiniband_lifespan_seconds", 0),
        ]
    )
    (reading,) = result.ports
    assert reading["hw_counters"] == {"roce_adp_retrans": 12, "local_ack_timeout_err": 3}
    assert reading["counters"] == {"VL15_dropped": 2, "symbol_error": 7}
    assert result.unrecognised == {"node_infiniband_lifespan_seconds"}
    PortSample.model_validate(reading)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("node_infiniband_rate_bytes_per_second", 1.3e9),  # not a 0.5 Gb/s step
        ("node_infiniband_port_data_received_bytes_total", 18527669),  # not whole words
        ("node_infiniband_symbol_error_total", 2.0**53),  # float64 cannot say which integer
        ("node_infiniband_symbol_error_total", 1.5),
        ("node_infiniband_symbol_error_total", -1),
        ("node_infiniband_symbol_error_total", float("nan")),  # a staleness marker
        ("node_infiniband_state_id", 256),
    ],
)
def test_node_exporter_inexact_values_are_skipped_not_rounded(name: str, value: float) -> None:
    result = map_node_exporter(
        [
            one("node_infiniband_state_id", 4),
            one(name, value),
            one("node_infiniband_link_downed_total", 1),
        ]
    )
    (reading,) = result.ports
    assert reading["counters"] == {"link_downed": 1}  # nothing else, and no empty dict
    assert "rate_gbps" not in reading
    assert reading["state_code"] == 4
    assert len(result.skipped) == 1 and name in result.skipped[0]
    assert name in result.recognised


def test_node_exporter_largest_exact_words_are_kept() -> None:
    words = (2**53 - 4) // 4
    (reading,) = map_node_exporter(
        [one("node_infiniband_port_data_transmitted_bytes_total", float(words * 4))]
    ).ports
    assert reading["counters"] == {"port_xmit_data": words}


def test_node_exporter_one_reading_per_device_port_and_time() -> None:
    later = TS + timedelta(seconds=15)
    result = map_node_exporter(
        [
            one("node_infiniband_state_id", 4),
            one("node_infiniband_state_id", 1, ts=later),
            one("node_infiniband_state_id", 4, device="mlx5_1", port="1"),
            one("node_infiniband_state_id", 4, device="mlx5_0", port="2"),
            one("node_infiniband_state_id", 2),  # the same series twice at one time
        ]
    )
    keys = [(p["device"], p["port"], p["ts"], p["state_code"]) for p in result.ports]
    assert keys == [
        ("mlx5_0", 1, TS, 4),
        ("mlx5_0", 1, later, 1),
        ("mlx5_0", 2, TS, 4),
        ("mlx5_1", 1, TS, 4),
    ]
    assert len(result.skipped) == 1 and "second sample" in result.skipped[0]


@pytest.mark.parametrize(
    "labels",
    [{"port": "1"}, {"device": "mlx5_0"}, {"device": "mlx5_0", "port": "x"},
     {"device": "mlx5_0", "port": "256"}, {"device": "mlx/5", "port": "1"}],
)  # fmt: skip
def test_node_exporter_port_labels_that_name_no_port_are_skipped(
    labels: Mapping[str, str],
) -> None:
    result = map_node_exporter([("node_infiniband_link_downed_total", labels, 1.0, TS)])
    assert result.ports == []
    assert len(result.skipped) == 1


@pytest.mark.parametrize(
    "labels", [{"controller": "0", "csrow": "row1"}, {"controller": "mc0", "csrow": "1"}, {}]
)
def test_node_exporter_edac_labels_must_be_numbers(labels: Mapping[str, str]) -> None:
    result = map_node_exporter([("node_edac_csrow_correctable_errors_total", labels, 1.0, TS)])
    assert result.edac == []
    assert len(result.skipped) == 1


def reading(
    value: int, *, kind: str = "uncorrected", csrow: int | str | None = None
) -> EdacReading:
    return EdacReading(controller=1, csrow=csrow, kind=kind, value=value, ts=TS)  # type: ignore[arg-type]


def test_edac_first_reading_sets_the_baseline() -> None:
    assert edac_event(None, reading(7)) is None


@pytest.mark.parametrize("previous", [7, 9])
def test_edac_no_increase_or_a_reset_is_no_event(previous: int) -> None:
    assert edac_event(previous, reading(7)) is None


def test_edac_increase_becomes_an_event_the_rules_judge() -> None:
    event = edac_event(4, reading(7))
    assert event is not None
    assert event["details"] == {
        "severity": "uncorrected",
        "count": 3,
        "memory_controller": 1,
        "source": "node_exporter",
    }
    assert event["ts"] == TS and "MC1" in event["message"]
    wire = Event.model_validate(event)
    (verdict,) = judge_host_errors([wire], gpus={}, now=TS)
    assert (verdict.rule, verdict.count) == ("edac_uncorrected", 3)
    assert verdict.evidence["memory_controllers"] == [1]


def test_edac_corrected_row_event_names_its_row() -> None:
    event = edac_event(0, reading(2, kind="corrected", csrow="unknown"))
    assert event is not None
    assert event["details"]["severity"] == "corrected"
    assert event["details"]["csrow"] == "unknown"
    Event.model_validate(event)


def test_edac_event_count_is_capped_at_what_the_wire_takes() -> None:
    event = edac_event(0, reading(2**52))
    assert event is not None
    assert event["details"]["count"] == MAX_EVENT_COUNT
    Event.model_validate(event)


def test_edac_reading_counter_key_tells_rows_and_totals_apart(
    mapped: NodeExporterReadings,
) -> None:
    keys = [r.counter for r in mapped.edac]
    assert len(keys) == len(set(keys)) == 10
