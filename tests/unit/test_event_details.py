"""What the rules read of an event's details, and the one check ingest and the rules share
(fleetwatch.event_details, issue 35).

Every kind a rule reads details of is covered; each key refuses what the rules cannot read, with
the path and a reason; null, unknown keys and kinds no rule reads stay free; and what the agent's
own parsers (on real kernel-log captures) and the server's port-event derivation write passes, so
no agent or server ever makes what the check refuses.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.parsers.kernel_events import parse_kernel_events
from fleetwatch.event_details import DETAIL_FIELDS, MAX_EVENT_COUNT, details_problem
from fleetwatch.rules.host_errors import HOST_KINDS
from fleetwatch.rules.port_events import PORT_KINDS, derive_port_events
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.storable import INT64_MAX

TESTS = Path(__file__).resolve().parents[1]
SHARED = TESTS.parent.parent / "shared" / "fixtures"
CAPTURES = [
    *sorted((TESTS / "fixtures" / "kernel_log_captures").glob("*.log")),
    *sorted((SHARED / "host_hw_errors").glob("*.log")),
    *sorted((SHARED / "nvswitch_fabric").glob("*.log")),
]


def test_every_kind_the_rules_read_details_of_is_checked() -> None:
    assert set(DETAIL_FIELDS) == HOST_KINDS | PORT_KINDS


@pytest.mark.parametrize(
    ("kind", "details", "path", "words"),
    [
        ("mce", {"severity": "deferred", "bank": [1]}, ("bank",), "an integer"),
        ("mce", {"bank": True}, ("bank",), "an integer (the machine-check bank), not a boolean"),
        ("mce", {"bank": 1.0}, ("bank",), "not a number (1.0)"),
        ("mce", {"bank": -1}, ("bank",), "at least 0"),
        ("mce", {"panic": {"reason": "x"}}, ("panic",), "text"),
        ("sxid", {"sxid": [12028]}, ("sxid",), "an integer (the SXid code), not a list"),
        ("sxid", {"severity": 3}, ("severity",), "must be text"),
        ("sxid", {"switch": ["sw0"]}, ("switch",), "must be text"),
        ("pcie_aer", {"errors": 7}, ("errors",), "a list of texts"),
        ("pcie_aer", {"errors": ["RxErr", {"x": 1}]}, ("errors", 1), "not an object"),
        ("edac", {"count": MAX_EVENT_COUNT + 1}, ("count",), f"at most {MAX_EVENT_COUNT}"),
        ("edac", {"count": INT64_MAX}, ("count",), "the errors this one event counts"),
        ("edac", {"count": -3}, ("count",), "at least 0"),
        ("edac", {"memory_controller": "0"}, ("memory_controller",), "an integer"),
        ("port_flap", {"device": "mlx5_0", "increase": "3"}, ("increase",), "an integer"),
        ("port_down", {"device": ["mlx5_0"]}, ("device",), "must be text"),
        ("port_degraded", {"rate_gbps": "fast"}, ("rate_gbps",), "a number"),
        ("edac", ["severity", "corrected"], (), "must be an object"),
    ],
)
def test_what_the_rules_cannot_read_is_named(
    kind: str, details: Any, path: tuple[Any, ...], words: str
) -> None:
    problem = details_problem(kind, details)
    assert problem is not None
    assert problem[0] == path
    assert words in problem[1], problem[1]
    assert f"the rules read it in every {kind!r} event" in problem[1] or path == ()


@pytest.mark.parametrize(
    ("kind", "details"),
    [
        ("mce", {"severity": "fatal", "bank": None, "cpu": 0, "misc": [1, {"x": 2}]}),
        ("edac", {"severity": "corrected", "count": MAX_EVENT_COUNT, "label": "DIMM_A1"}),
        ("edac", {"count": 0}),
        ("pcie_aer", {"errors": [], "reported_by": "0000:00:01.0"}),
        ("port_errors", {"device": "mlx5_0", "limit": 10.5, "per_s": 1, "increase": -1}),
        ("agent_start", {"bank": [1], "count": INT64_MAX}),  # a kind no rule reads
        ("xid", {"sxid": [1]}),
        ("mce", None),
        ("mce", {}),
    ],
)
def test_what_the_rules_can_read_or_do_not_read_passes(kind: str, details: Any) -> None:
    assert details_problem(kind, details) is None


def test_the_agents_parsers_write_only_readable_details() -> None:
    if not (SHARED / "nvswitch_fabric").is_dir():
        pytest.skip(f"fixture not found: {SHARED / 'nvswitch_fabric'}")
    kinds = set()
    for capture in CAPTURES:
        events = parse_kernel_events(capture.read_text(errors="replace"), year_hint=2024).events
        for e in events:
            assert details_problem(e.kind, e.details) is None, (capture.name, e.kind, e.details)
            kinds.add(e.kind)
    assert kinds >= HOST_KINDS, kinds  # the captures hold every kind the host rules judge


def test_the_servers_port_events_are_readable() -> None:
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    base = {
        "device": "mlx5_0", "port": 1, "netdev": "ib0", "link_layer": "InfiniBand",
        "boot_id": "b", "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
        "link_width": 4, "link_speed": "NDR",
    }  # fmt: skip
    readings = [
        {**base, "ts": t0, "counters": {"link_downed": 0, "symbol_error": 0}, "rates": None},
        {**base, "ts": t0 + timedelta(seconds=10), "rate_gbps": 200.0, "link_width": 2,
         "counters": {"link_downed": 2, "symbol_error": 10**6},
         "rates": {"counters": {"link_downed": {"increase": 2}}}},
        {**base, "ts": t0 + timedelta(seconds=20), "state": "DOWN", "phys_state": "Polling",
         "counters": {"link_downed": 3, "symbol_error": 10**6}, "rates": None},
    ]  # fmt: skip
    before, made = None, []
    for reading in readings:
        change = derive_port_events(
            before, reading, thresholds=HealthThresholds(), recent_flaps=lambda *_: 0
        )
        made += change.events
        before = {**reading, "health": change.health}
    assert {e["kind"] for e in made} >= {"port_degraded", "port_flap", "port_down"}
    for e in made:
        assert details_problem(e["kind"], e["details"]) is None, e
