"""An adapter port's reading at one instant, as closed-form functions of time (as for the GPUs).

What sysfs shows under ``/sys/class/infiniband/<device>/ports/<n>/``, in its units:

* ``port_rcv_data`` / ``port_xmit_data`` count 4-byte words: the integral of the node's busy
  level over its job segments (prefix sums) times the port's share of its rate; a dead link
  carries nothing. Packets are MTU-sized (4 KiB: 1024 words);
* ``symbol_error`` is a background trickle plus each degradation's ramp; ``port_rcv_errors`` a
  quarter of it; ``link_downed`` counts the starts of the link's DOWN intervals and
  ``link_error_recovery`` its retrains (each flap's, a downshift's, and one per 2,000 symbol
  errors of a degradation);
* ``hw_counters``: the mlx5 transport counters, the ``roce_*`` ones on RoCE ports only.

Every counter restarts from zero at a boot (the driver loads anew) and never falls within one.
The PMA error counters saturate at their width, as the hardware's do: ``symbol_error`` and
``port_rcv_errors`` at 16 bits, ``link_downed`` and ``link_error_recovery`` at 8,
``port_xmit_wait`` at 32; the data and packet counters are 64-bit.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from fleetwatch.sim.links import LinkFault, NodeLinks, PortPlan
from fleetwatch.sim.spec import NetworkSpec
from fleetwatch.sim.timeline import Jobs

__all__ = ["TrafficLedger", "port_readings"]

WORDS_PER_PACKET = 1024  # a 4 KiB MTU
_U8, _U16, _U32 = 2**8 - 1, 2**16 - 1, 2**32 - 1
# A link that is not up: sysfs shows the rate it falls back to, 4X QDR, as ibstat's "Rate: 40".
_DOWN_LINK = {"rate_gbps": 40.0, "link_width": 4, "link_speed": "QDR"}
_ZERO_COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_discards",
)
_ZERO_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "out_of_buffer",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_dct_connect",
)
_ZERO_ROCE_COUNTERS = ("roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_icrc_encapsulated")


class TrafficLedger:
    """Busy level-seconds of a node since its first job segment: traffic is proportional."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        pairs = zip(jobs.busy, jobs.level, strict=True)
        self._level = [level if busy else 0.0 for busy, level in pairs]
        self._cumulative = [0.0]
        for k in range(len(jobs.starts) - 1):
            span = jobs.starts[k + 1] - jobs.starts[k]
            self._cumulative.append(self._cumulative[-1] + self._level[k] * span)

    def level_seconds(self, t: float) -> float:
        k = self._jobs.segment(t)
        return self._cumulative[k] + self._level[k] * max(0.0, t - self._jobs.starts[k])


def _count(times: list[float], a: float, b: float) -> int:
    """How many of the sorted ``times`` fall in ``(a, b]``."""
    return bisect.bisect_right(times, b) - bisect.bisect_right(times, a)


def port_readings(
    net: NetworkSpec,
    links: NodeLinks,
    port: PortPlan,
    ledger: TrafficLedger,
    *,
    install_s: float,
    boot_s: float,
    t: float,
) -> dict[str, Any]:
    """Every :class:`~fleetwatch.telemetry.PortSample` field but ``ts`` at time ``t``."""
    faults: list[LinkFault] = links.by_rail.get(port.rail, [])
    dead_s = links.dead_from(port.rail)
    downs = sorted(a for f in faults for a, _ in f.downs)
    retrains = sorted(r for f in faults for r in f.recoveries)
    is_down = any(a <= t < b for f in faults for a, b in f.downs)

    words_per_s = net.rate_gbps * 1e9 / 32.0 * links.traffic_share

    def words(at: float) -> float:
        return ledger.level_seconds(min(at, dead_s)) * words_per_s

    def symbols(at: float) -> float:
        background = port.symbol_per_s * max(0.0, min(at, dead_s) - install_s)
        return background + sum(f.symbols(at) for f in faults)

    def ramp_symbols(at: float) -> float:
        return sum(f.symbols(at) for f in faults)

    def since_boot(value_at: Callable[[float], float]) -> int:
        return max(0, math.floor(value_at(t)) - math.floor(value_at(boot_s)))

    xmit = since_boot(lambda at: words(at) * port.tx_factor)
    rcv = since_boot(lambda at: words(at) * port.rx_factor)
    symbol_errors = since_boot(symbols)
    link_downs = _count(downs, boot_s, t)
    recoveries = _count(retrains, boot_s, t) + since_boot(lambda at: ramp_symbols(at) / 2000.0)

    counters = dict.fromkeys(_ZERO_COUNTERS, 0) | {
        "link_downed": min(_U8, link_downs),
        "link_error_recovery": min(_U8, recoveries),
        "port_rcv_data": rcv,
        "port_rcv_errors": min(_U16, since_boot(lambda at: symbols(at) / 4.0)),
        "port_rcv_packets": rcv // WORDS_PER_PACKET,
        "port_xmit_data": xmit,
        "port_xmit_packets": xmit // WORDS_PER_PACKET,
        "port_xmit_wait": min(_U32, math.floor(xmit * port.wait_per_word)),
        "symbol_error": min(_U16, symbol_errors),
        "unicast_rcv_packets": rcv // WORDS_PER_PACKET,
        "unicast_xmit_packets": xmit // WORDS_PER_PACKET,
    }
    # Lost packets time out on the queue pairs above the link and arrive out of order.
    lost = since_boot(lambda at: symbols(at) / 50.0)
    hw_counters = dict.fromkeys(_ZERO_HW_COUNTERS, 0) | {
        "local_ack_timeout_err": 3 * link_downs + since_boot(lambda at: symbols(at) / 500.0),
        "out_of_sequence": lost,
        "packet_seq_err": lost,
        "rx_read_requests": rcv // 2**18,  # 1 MiB reads
        "rx_write_requests": rcv // 2**16,  # 256 KiB writes
    }
    if port.link_layer == "Ethernet":
        # No link-level retransmission on Ethernet: lost packets cost RoCE retransmits.
        retrans = since_boot(lambda at: symbols(at) / 10.0) + 20 * link_downs
        hw_counters |= dict.fromkeys(_ZERO_ROCE_COUNTERS, 0) | {
            "roce_adp_retrans": retrans,
            "roce_adp_retrans_to": retrans // 20,
            "roce_slow_restart": link_downs,
        }

    if is_down:
        link: dict[str, Any] = {"state": "DOWN", "state_code": 1}
        link |= {"phys_state": "Polling", "phys_state_code": 2} | _DOWN_LINK
    else:
        narrowed = any(f.narrowed(t) for f in faults)
        width = max(1, net.link_width // 2) if narrowed else net.link_width
        link = {"state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp", "phys_state_code": 5}
        link |= {
            "rate_gbps": net.rate_gbps * width / net.link_width,
            "link_width": width,
            "link_speed": net.link_speed,
        }
    return {
        "device": port.device,
        "port": port.port,
        "link_layer": port.link_layer,
        "node_guid": port.node_guid,
        "netdev": port.netdev,
        **link,
        "counters": dict(sorted(counters.items())),
        "hw_counters": dict(sorted(hw_counters.items())),
    }
