"""What the port rules cost the server's ingest: deriving port events from each port reading.

Every port reading of a batch is compared with the port's stored one
(:func:`fleetwatch.rules.port_events.derive_port_events`: link state, rate against the port's
normal, ``link_downed``, the error counters' window). This times that comparison alone, in one
process, over ``--readings`` consecutive readings of one port shaped like the real H100 node's
(the 21 ``counters/`` and 25 ``hw_counters/`` names of
``../shared/fixtures/infiniband/gpud__sys-class-infiniband-h100_tree.tar``), every counter rising
by one a reading, so an error window fills and reports as it would on a marginal link. It reports
the median and best of ``--runs`` runs, per reading and per batch of 8 ports.

    .venv/bin/python benchmarks/port_events.py [--readings 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fleetwatch.rules.port_events import derive_port_events  # noqa: E402
from fleetwatch.rules.thresholds import HealthThresholds  # noqa: E402

COUNTERS = (
    "VL15_dropped excessive_buffer_overrun_errors link_downed link_error_recovery "
    "local_link_integrity_errors multicast_rcv_packets multicast_xmit_packets "
    "port_rcv_constraint_errors port_rcv_data port_rcv_errors port_rcv_packets "
    "port_rcv_remote_physical_errors port_rcv_switch_relay_errors port_xmit_constraint_errors "
    "port_xmit_data port_xmit_discards port_xmit_packets port_xmit_wait symbol_error "
    "unicast_rcv_packets unicast_xmit_packets"
).split()
HW_COUNTERS = (
    "duplicate_request implied_nak_seq_err lifespan local_ack_timeout_err out_of_buffer "
    "out_of_sequence packet_seq_err req_cqe_error req_cqe_flush_error req_remote_access_errors "
    "req_remote_invalid_request resp_cqe_error resp_cqe_flush_error resp_local_length_error "
    "resp_remote_access_errors rnr_nak_retry_err roce_adp_retrans roce_adp_retrans_to "
    "roce_slow_restart roce_slow_restart_cnps roce_slow_restart_trans rx_atomic_requests "
    "rx_dct_connect rx_icrc_encapsulated rx_read_requests"
).split()
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _reading(i: int) -> dict[str, Any]:
    rate = {"per_s": 0.1, "increase": 1, "reset": False}
    return {
        "device": "mlx5_0", "port": 1, "netdev": "ib0", "link_layer": "InfiniBand",
        "ts": T0 + timedelta(seconds=10 * i), "boot_id": "boot-1",
        "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp", "phys_state_code": 5,
        "rate_gbps": 400.0, "link_width": 4, "link_speed": "NDR",
        "counters": dict.fromkeys(COUNTERS, i), "hw_counters": dict.fromkeys(HW_COUNTERS, i),
        # link_downed left out of the rates: a flap would ask the events table (rare)
        "rates": {"counters": {n: rate for n in COUNTERS if n != "link_downed"},
                  "hw_counters": dict.fromkeys(HW_COUNTERS, rate)},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.readings, args.runs = 200, 1
    thresholds = HealthThresholds()
    readings = [_reading(i) for i in range(args.readings + 1)]
    per_reading, events = [], 0
    for _ in range(args.runs):
        before: dict[str, Any] = {**readings[0], "health": {}}
        events = 0
        started = time.perf_counter()
        for reading in readings[1:]:
            change = derive_port_events(
                before, reading, thresholds=thresholds, recent_flaps=lambda _d, _p, _s: 0
            )
            events += len(change.events)
            before = {**reading, "health": change.health}
        per_reading.append((time.perf_counter() - started) / args.readings)
    median, best = statistics.median(per_reading) * 1e6, min(per_reading) * 1e6
    print(f"{args.readings} readings x {args.runs} runs, {events} port events a run")
    print(f"per port reading: median {median:.1f} us, best {best:.1f} us")
    print(f"per batch of 8 ports: median {median * 8 / 1000:.3f} ms")


if __name__ == "__main__":
    main()
