"""The host-error and port rules on events stored before ingest checked their details (issue 35).

A machine check whose bank is a list, an AER record whose error names are a number, an SXid whose
code is a list: each once raised out of the rules (``TypeError`` in ``_distinct``, "int is not
iterable" in ``aer_evidence``), and the node went unjudged every pass. Now each is skipped and
named in one verdict, and the node's readable events are judged as before. Sums of error counts
saturate at a signed 64-bit integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetwatch.rules.host_errors import judge_host_errors
from fleetwatch.rules.host_evidence import HostRecord, errors
from fleetwatch.rules.port_health import judge_port_events
from fleetwatch.storable import INT64_MAX

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Stored:
    """An event as the judge reads it from the events table (nothing validated)."""

    kind: str
    ts: datetime | None
    details: Any
    pci_bus_id: str | None = None
    uuid: str | None = None


def _ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def test_unreadable_host_events_are_skipped_named_and_the_rest_still_judged() -> None:
    evs = [
        Stored("mce", _ago(30), {"severity": "deferred", "bank": [1]}),
        Stored("sxid", _ago(20), {"severity": "fatal", "sxid": [12028]}),
        Stored("pcie_aer", _ago(15), {"severity": "fatal", "errors": 7}, "0000:3b:00.0"),
        Stored("edac", _ago(12), {"severity": "corrected", "count": INT64_MAX}),
        Stored("mce", _ago(10), {"severity": "uncorrected", "bank": 4, "source": "mce"}),
        Stored("mce", _ago(5), ["not", "an", "object"]),
    ]
    verdicts = judge_host_errors(evs, gpus={"0000:3b:00.0": "GPU-a"}, now=NOW)  # type: ignore[arg-type]

    by_rule = {v.rule: v for v in verdicts}
    assert set(by_rule) == {"mce_uncorrected", "unreadable_host_events"}
    assert by_rule["mce_uncorrected"].evidence["banks"] == [4]
    named = by_rule["unreadable_host_events"]
    assert (named.scope, named.severity, named.action) == ("node", "warning", "investigate")
    assert named.count == 5
    skipped = [(s["kind"], s["field"]) for s in named.evidence["skipped"]]
    assert skipped == [
        ("mce", "details.bank"),
        ("sxid", "details.sxid"),
        ("pcie_aer", "details.errors"),
        ("edac", "details.count"),
        ("mce", "details"),
    ]
    first = named.evidence["skipped"][0]
    assert first["ts"] == _ago(30).isoformat()
    assert "must be an integer" in first["reason"] and "not a list" in first["reason"]
    assert "at most 4294967295" in named.evidence["skipped"][3]["reason"]
    assert named.note.startswith(f"mce event of {_ago(30).isoformat()} not judged: details.bank")


def test_a_node_with_only_readable_events_gets_no_unreadable_verdict() -> None:
    evs = [Stored("mce", _ago(1), {"severity": "uncorrected", "bank": 4, "panic": None})]
    rules = [v.rule for v in judge_host_errors(evs, gpus={}, now=NOW)]  # type: ignore[arg-type]
    assert rules == ["mce_uncorrected"]


def test_unreadable_port_events_are_skipped_named_and_the_port_still_judged() -> None:
    port = {"device": "mlx5_0", "port": 1, "netdev": "ib0"}
    evs = [
        Stored("port_down", _ago(10), {**port, "severity": "critical", "state": ["DOWN"]}),
        Stored("port_flap", _ago(8), {**port, "severity": "warning", "increase": "three"}),
        Stored("port_down", _ago(5), {**port, "severity": "critical", "state": "DOWN"}),
    ]
    verdicts = judge_port_events(evs, now=NOW)  # type: ignore[arg-type]

    by_rule = {v.rule: v for v in verdicts}
    assert set(by_rule) == {"port_down", "unreadable_port_events"}
    assert by_rule["port_down"].evidence["state"] == "DOWN"
    fields = [s["field"] for s in by_rule["unreadable_port_events"].evidence["skipped"]]
    assert fields == ["details.state", "details.increase"]


def test_sums_of_error_counts_saturate_at_64_bits() -> None:
    records = [
        HostRecord("edac", _ago(i), None, None, {"severity": "corrected", "count": INT64_MAX})
        for i in range(3)
    ]
    assert errors(records) == INT64_MAX
    assert errors(records[:1]) == INT64_MAX
    assert errors([]) == 0


def test_port_flap_increases_saturate_at_64_bits() -> None:
    port = {"device": "mlx5_0", "port": 1, "severity": "critical", "link_downed": 3}
    evs = [Stored("port_flap", _ago(i), {**port, "increase": INT64_MAX}) for i in range(3)]
    [flap] = judge_port_events(evs, now=NOW)  # type: ignore[arg-type]
    assert flap.rule == "port_flap"
    assert flap.count == INT64_MAX
    assert flap.evidence["link_downed_increase"] == INT64_MAX
