"""node_exporter's InfiniBand and EDAC series, as FleetWatch port readings and EDAC counts.

node_exporter reads sysfs through prometheus/procfs (``collector/infiniband_linux.go``,
``collector/edac_linux.go``) and changes a few things on the way; this module undoes them where
that is exact and leaves the field absent where it is not::

    node_exporter series {labels}                    FleetWatch (PortSample field or record)
    node_infiniband_state_id {device,port}           state_code; state: the kernel's name for it
    node_infiniband_physical_state_id                phys_state_code; phys_state (5 -> LinkUp)
    node_infiniband_rate_bytes_per_second            rate_gbps = value / 125e6 (procfs multiplied
                                                     sysfs's "<n> Gb/sec" by 125e6)
    node_infiniband_port_data_*_bytes_total          counters port_rcv_data / port_xmit_data =
                                                     value / 4 (procfs multiplied the 4-byte words)
    node_infiniband_<name>_total                     counters[<sysfs name>], hw_counters[<name>]
    node_edac_{correctable,uncorrectable}_errors_total {controller}       EdacReading, csrow None
    node_edac_csrow_{correctable,uncorrectable}_errors_total {controller,csrow}
                                                     EdacReading, csrow an int, or "unknown" for
                                                     the controller's ce/ue_noinfo_count

Exactness: a value arrives as a float64. A count is kept when it is a whole number below 2**53
(above, float64 cannot tell neighbouring integers apart, so it may not be what sysfs said); a data
counter must also divide by 4, and a rate must be a multiple of 62,500,000 bytes/s, because the
kernel prints rates in steps of 0.5 Gb/s. A value failing these is reported in ``skipped``, not
rounded. procfs multiplies the data words in a uint64, so a sysfs value at or beyond 2**62 words
(16 EiB) would wrap undetectably; no port gets there.

node_exporter does not export ``link_layer``, ``node_guid``, ``netdev``, ``link_width`` or
``link_speed`` (procfs drops the ``(4X NDR)`` of the rate), nor the state names (sysfs prints
``4: ACTIVE``; only the 4 is exported): the names here are the kernel's tables for those codes
(``drivers/infiniband/core/sysfs.c``). Known series that map onto nothing are ``unrecognised``,
as foreign ones are: ``node_infiniband_info`` (board and firmware: no PortSample field),
``node_infiniband_legacy_*`` (``counters_ext/``, not ``counters/``), ``..._lifespan_seconds``
(a cache period, not a counter) and ``node_edac_channel_*`` (a split of the csrow counts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from fleetwatch.event_details import MAX_EVENT_COUNT
from fleetwatch.telemetry import PortSample

__all__ = [
    "NODE_EXPORTER_METRIC_NAMES",
    "EdacReading",
    "NodeExporterReadings",
    "Sample",
    "edac_event",
    "is_node_exporter_metric",
    "map_node_exporter",
]

Sample = tuple[str, Mapping[str, str], float, datetime]
"""One remote-write sample: series name, labels, value, timestamp (UTC-aware)."""

EdacKind = Literal["corrected", "uncorrected"]
Csrow = int | Literal["unknown"] | None

_EXACT_BELOW = 2**53  # every integer below is a float64; above, neighbours share one
_BYTES_PER_GBPS = 125_000_000  # procfs: bytes/s = Gb/s * 125e6
_RATE_STEP = _BYTES_PER_GBPS // 2  # the kernel prints rates in 0.5 Gb/s steps
_WORD = 4  # port_rcv_data and port_xmit_data count 4-byte words

# node_exporter suffix -> sysfs file in ports/<n>/counters/ (procfs's InfiniBandCounters).
_COUNTERS = {
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "link_downed_total": "link_downed",
    "link_error_recovery_total": "link_error_recovery",
    "local_link_integrity_errors_total": "local_link_integrity_errors",
    "multicast_packets_received_total": "multicast_rcv_packets",
    "multicast_packets_transmitted_total": "multicast_xmit_packets",
    "port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "port_data_received_bytes_total": "port_rcv_data",
    "port_data_transmitted_bytes_total": "port_xmit_data",
    "port_discards_received_total": "port_rcv_discards",
    "port_discards_transmitted_total": "port_xmit_discards",
    "port_errors_received_total": "port_rcv_errors",
    "port_packets_received_total": "port_rcv_packets",
    "port_packets_transmitted_total": "port_xmit_packets",
    "port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "port_transmit_wait_total": "port_xmit_wait",
    "symbol_error_total": "symbol_error",
    "unicast_packets_received_total": "unicast_rcv_packets",
    "unicast_packets_transmitted_total": "unicast_xmit_packets",
    "vl15_dropped_total": "VL15_dropped",
}
# node_exporter suffix -> sysfs file in ports/<n>/hw_counters/ (procfs's InfiniBandHwCounters).
_HW_COUNTERS = {
    "duplicate_requests_packets_total": "duplicate_request",
    "implied_nak_seq_errors_total": "implied_nak_seq_err",
    "local_ack_timeout_errors_total": "local_ack_timeout_err",
    "np_cnp_packets_sent_total": "np_cnp_sent",
    "np_ecn_marked_roce_packets_received_total": "np_ecn_marked_roce_packets",
    "out_of_buffer_drops_total": "out_of_buffer",
    "out_of_sequence_packets_received_total": "out_of_sequence",
    "packet_sequence_errors_total": "packet_seq_err",
    "req_cqes_errors_total": "req_cqe_error",
    "req_cqes_flush_errors_total": "req_cqe_flush_error",
    "req_remote_access_errors_total": "req_remote_access_errors",
    "req_remote_invalid_request_errors_total": "req_remote_invalid_request",
    "resp_cqes_errors_total": "resp_cqe_error",
    "resp_cqes_flush_errors_total": "resp_cqe_flush_error",
    "resp_local_length_errors_total": "resp_local_length_error",
    "resp_remote_access_errors_total": "resp_remote_access_errors",
    "rnr_nak_retry_packets_received_total": "rnr_nak_retry_err",
    "roce_adp_retransmits_total": "roce_adp_retrans",
    "roce_adp_retransmits_timeout_total": "roce_adp_retrans_to",
    "roce_slow_restart_used_total": "roce_slow_restart",
    "roce_slow_restart_cnps_total": "roce_slow_restart_cnps",
    "roce_slow_restart_total": "roce_slow_restart_trans",
    "rp_cnp_packets_handled_total": "rp_cnp_handled",
    "rp_cnp_ignored_packets_received_total": "rp_cnp_ignored",
    "rx_atomic_requests_total": "rx_atomic_requests",
    "rx_dct_connect_requests_total": "rx_dct_connect",
    "rx_icrc_encapsulated_errors_total": "rx_icrc_encapsulated",
    "rx_read_requests_total": "rx_read_requests",
    "rx_write_requests_total": "rx_write_requests",
}
_WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})

# Full series name -> (PortSample section, key). Sections "counters" and "hw_counters" are dicts.
_PORT_SERIES: dict[str, tuple[str, str]] = {
    "node_infiniband_state_id": ("link", "state"),
    "node_infiniband_physical_state_id": ("link", "phys_state"),
    "node_infiniband_rate_bytes_per_second": ("link", "rate_gbps"),
    **{f"node_infiniband_{k}": ("counters", v) for k, v in _COUNTERS.items()},
    **{f"node_infiniband_{k}": ("hw_counters", v) for k, v in _HW_COUNTERS.items()},
}
# Full series name -> (kind, whether it carries a csrow label).
_EDAC_SERIES: dict[str, tuple[EdacKind, bool]] = {
    "node_edac_correctable_errors_total": ("corrected", False),
    "node_edac_uncorrectable_errors_total": ("uncorrected", False),
    "node_edac_csrow_correctable_errors_total": ("corrected", True),
    "node_edac_csrow_uncorrectable_errors_total": ("uncorrected", True),
}

# The names sysfs prints beside each code (drivers/infiniband/core/sysfs.c). A state code beyond
# the table prints UNKNOWN; a physical one prints "<unknown>", which the wire refuses, so it has
# no name here and only its code is sent.
_STATE_NAMES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
_PHYS_STATE_NAMES = (
    None,
    "Sleep",
    "Polling",
    "Disabled",
    "PortConfigurationTraining",
    "LinkUp",
    "LinkErrorRecovery",
    "Phy Test",
)


@dataclass(frozen=True)
class EdacReading:
    """One EDAC counter of one memory controller at one instant.

    ``csrow`` is None for the controller's total (which counts every error once), an int for a
    chip-select row, and ``"unknown"`` for the errors the driver could not place on a row.
    """

    controller: int
    csrow: Csrow
    kind: EdacKind
    value: int
    ts: datetime

    @property
    def counter(self) -> tuple[int, Csrow, EdacKind]:
        """Which counter this is: the key under which to keep its previous value."""
        return (self.controller, self.csrow, self.kind)


@dataclass
class NodeExporterReadings:
    """What :func:`map_node_exporter` made of one node's samples.

    ``ports``: dicts shaped as :class:`~fleetwatch.telemetry.PortSample`, one per (device, port,
    ts), each already validated by it. ``recognised``/``unrecognised``: the series names this
    module maps and those it does not. ``skipped``: why a sample of a recognised series was not
    used (a value that is not exact, a label that is not a number, a duplicate).
    """

    ports: list[dict[str, Any]] = field(default_factory=list)
    edac: list[EdacReading] = field(default_factory=list)
    recognised: set[str] = field(default_factory=set)
    unrecognised: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


NODE_EXPORTER_METRIC_NAMES = frozenset(_PORT_SERIES) | frozenset(_EDAC_SERIES)
"""Every node_exporter series name :func:`map_node_exporter` reads."""


def is_node_exporter_metric(name: str) -> bool:
    """Whether :func:`map_node_exporter` reads the series ``name``."""
    return name in _PORT_SERIES or name in _EDAC_SERIES


def map_node_exporter(samples: Iterable[Sample]) -> NodeExporterReadings:
    """Map one node's node_exporter samples onto port readings and EDAC counts."""
    out = NodeExporterReadings()
    ports: dict[tuple[str, int, datetime], dict[str, Any]] = {}
    for name, labels, value, ts in samples:
        if name in _EDAC_SERIES:
            out.recognised.add(name)
            reading = _edac_reading(name, labels, value, ts)
            if isinstance(reading, str):
                out.skipped.append(reading)
            else:
                out.edac.append(reading)
        elif name in _PORT_SERIES:
            out.recognised.add(name)
            problem = _add_port_value(ports, name, labels, value, ts)
            if problem is not None:
                out.skipped.append(problem)
        else:
            out.unrecognised.add(name)
    for key in sorted(ports):
        port = ports[key]
        try:
            PortSample.model_validate(port)
        except ValidationError as exc:
            out.skipped.append(f"port {key[0]}/{key[1]}: {exc.errors()[0]['msg']}")
            continue
        out.ports.append(port)
    return out


def edac_event(previous: int | None, reading: EdacReading) -> dict[str, Any] | None:
    """The ``edac`` event for a counter that rose from ``previous`` to ``reading.value``, shaped
    as the agent's (:mod:`fleetwatch.agent.parsers.edac`); None when there is nothing to report.

    The first reading (``previous`` None) sets the baseline: its errors happened at unknown times
    since boot, and dating them now would misplace them. A value below ``previous`` is a reset
    (reboot, driver reload): no event, the new value becomes the baseline.

    Make events from one level only, the controller totals (``csrow`` None) or the rows, never
    both: a row's errors are also in its controller's total, and the rules sum counts.
    """
    if previous is None or reading.value <= previous:
        return None
    increase = reading.value - previous
    where = f"MC{reading.controller}" + ("" if reading.csrow is None else f" csrow {reading.csrow}")
    kind = "CE" if reading.kind == "corrected" else "UE"
    details: dict[str, Any] = {
        "severity": reading.kind,
        "count": min(increase, MAX_EVENT_COUNT),
        "memory_controller": reading.controller,
        "source": "node_exporter",
    }
    if reading.csrow is not None:
        details["csrow"] = reading.csrow
    return {
        "kind": "edac",
        "ts": reading.ts,
        "message": f"EDAC {where}: {increase} {kind} (node_exporter count "
        f"{previous} -> {reading.value})",
        "details": details,
    }


def _add_port_value(
    ports: dict[tuple[str, int, datetime], dict[str, Any]],
    name: str,
    labels: Mapping[str, str],
    value: float,
    ts: datetime,
) -> str | None:
    """Put one port sample into its reading; the reason when it cannot be used."""
    device, port = labels.get("device"), _index(labels.get("port"))
    if not device or port is None or port > 255:
        return f"{name}: labels device={device!r} port={labels.get('port')!r} name no port"
    where = f"{name}{{device={device!r},port='{port}'}}"
    whole = _whole(value)
    if whole is None:
        return f"{where}: {value!r} is not a count float64 holds exactly"
    section, key = _PORT_SERIES[name]
    values = _port_fields(key, whole)
    if isinstance(values, str):
        return f"{where}: {values}"
    reading = ports.setdefault((device, port, ts), {"device": device, "port": port, "ts": ts})
    target = reading if section == "link" else reading.setdefault(section, {})
    if values.keys() & target.keys():
        return f"{where}: a second sample at {ts.isoformat()}"
    target.update(values)
    return None


def _port_fields(key: str, whole: int) -> dict[str, Any] | str:
    """The PortSample fields one exact value gives, in FleetWatch's units; or why it gives none."""
    if key == "rate_gbps":
        if whole % _RATE_STEP:
            return f"{whole} bytes/s is not a whole number of 0.5 Gb/s"
        return {key: whole / _BYTES_PER_GBPS}
    if key in _WORD_COUNTERS:
        if whole % _WORD:
            return f"{whole} bytes is not a whole number of 4-byte words"
        return {key: whole // _WORD}
    if key in ("state", "phys_state"):
        if whole > 255:
            return f"state code {whole} is beyond a byte"
        names = _STATE_NAMES if key == "state" else _PHYS_STATE_NAMES
        state_name = names[whole] if whole < len(names) else _UNKNOWN_NAME[key]
        fields: dict[str, Any] = {f"{key}_code": whole}
        if state_name is not None:
            fields[key] = state_name
        return fields
    return {key: whole}


_UNKNOWN_NAME: dict[str, str | None] = {"state": "UNKNOWN", "phys_state": None}


def _edac_reading(
    name: str, labels: Mapping[str, str], value: float, ts: datetime
) -> EdacReading | str:
    kind, has_csrow = _EDAC_SERIES[name]
    controller = _index(labels.get("controller"))
    csrow: Csrow = None
    if has_csrow:
        row = labels.get("csrow")
        csrow = "unknown" if row == "unknown" else _index(row)
        if csrow is None:
            return f"{name}: csrow label {row!r} is neither a number nor 'unknown'"
    if controller is None:
        return f"{name}: controller label {labels.get('controller')!r} is not a number"
    whole = _whole(value)
    if whole is None:
        return f"{name}{{controller='{controller}'}}: {value!r} is not an exact count"
    return EdacReading(controller=controller, csrow=csrow, kind=kind, value=whole, ts=ts)


def _index(text: str | None) -> int | None:
    """A label holding a decimal number (node_exporter prints them so), else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


def _whole(value: float) -> int | None:
    """``value`` as the integer node_exporter had, when float64 holds it exactly; NaN (a
    staleness marker), infinities, fractions, negatives and values from 2**53 are not."""
    if not math.isfinite(value) or value < 0 or value >= _EXACT_BELOW or value != int(value):
        return None
    return int(value)
