"""A node's network adapter ports and what goes wrong with their links, drawn once per node.

One port per GPU rail (``mlx5_0`` .. ``mlx5_7``, port 1), InfiniBand unless the node runs RoCE
(Ethernet link layer). Each port draws, from its own substream, its constants (background symbol
errors, traffic split, congestion) and three kinds of link fault:

* **flap**: an episode of a few minutes to two hours in which the link goes down for seconds and
  retrains, one to a few times (``link_downed`` +1 and ``link_error_recovery`` +1..3 each time);
* **degrade**: the symbol-error rate climbs over hours (the same ``e^{g x}`` ramp as a GPU's
  precursors), the link may retrain at half its lanes (400 -> 200 Gb/s), and at the end it is
  reseated (down for a minute or so, then healthy) or it dies;
* **dead**: the link goes down for good (a dead transceiver), suddenly or after a degradation.

While a link flaps or is degraded or dead, the node's training steps run slower (see
:meth:`NodeLinks.slowdown_at`), as a throttled GPU slows them in a straggler window. Every draw is
made whether or not its result is kept (a fault while the node is down, or on a link that is
already faulty, is dropped), so that one quantity never shifts another's random numbers.

Times are float seconds since the simulation's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fleetwatch.sim._random import Stream, substream
from fleetwatch.sim.lifetimes import DAY, HOUR
from fleetwatch.sim.plan import NodePlan
from fleetwatch.sim.spec import FleetSpec
from fleetwatch.sim.timeline import MINUTE, MONTH, NodeTimeline

__all__ = ["LinkFault", "NodeLinks", "PortPlan", "build_links", "ramp_fraction"]

LinkLayer = Literal["InfiniBand", "Ethernet"]
FaultKind = Literal["flap", "degrade", "dead"]
_G = 4.0  # growth of a degrading link's symbol-error rate, as for a GPU's precursors
_MELLANOX_OUI = "946d:ae03"  # 94:6d:ae, the OUI in a ConnectX adapter's node GUID


def _us(seconds: float) -> float:
    return round(float(seconds), 6)


def ramp_fraction(x: float) -> float:
    """``(e^{g x} - 1) / (e^g - 1)``: a degrading link's error rate as a share of its peak."""
    x = min(1.0, max(0.0, x))
    return math.expm1(_G * x) / math.expm1(_G)


@dataclass(frozen=True)
class PortPlan:
    """One adapter port: identity and the constants its counters use."""

    rail: int  # 0-based, the GPU rail it serves
    device: str
    port: int
    link_layer: LinkLayer
    node_guid: str
    netdev: str
    rx_factor: float  # received over sent words: collectives are nearly symmetric
    tx_factor: float
    symbol_per_s: float  # background symbol errors of a healthy link
    wait_per_word: float  # port_xmit_wait ticks per word sent (congestion)


@dataclass(frozen=True)
class LinkFault:
    """One fault of one port. ``downs`` are the intervals the link is DOWN (``link_downed``
    counts their starts); ``recoveries`` the times ``link_error_recovery`` counts."""

    kind: FaultKind
    rail: int
    start_s: float
    end_s: float  # inf: down for good
    slowdown: float  # the node's steps at the worst of the fault
    downs: tuple[tuple[float, float], ...] = ()
    recoveries: tuple[float, ...] = ()
    symbol_peak_per_s: float = 0.0  # degrade: symbol-error rate reached at its end
    downshift_s: float | None = None  # degrade: when the link retrained at half its lanes
    then_dead: bool = False  # degrade: ended with the link down for good, not reseated

    @property
    def busy_until_s(self) -> float:
        """The end of the fault with its last down (a reseat ends after the degradation)."""
        return max([self.end_s, *(b for _, b in self.downs)])

    def slowdown_at(self, t: float) -> float:
        if not self.start_s <= t < self.end_s:
            return 1.0
        if self.kind != "degrade" or (self.downshift_s is not None and t >= self.downshift_s):
            return self.slowdown
        # Link-level retransmissions grow with the error rate; so does the time they cost.
        x = (t - self.start_s) / (self.end_s - self.start_s)
        return 1.0 + (self.slowdown - 1.0) * ramp_fraction(x)

    def symbols(self, t: float) -> float:
        """Symbol errors this degradation has added by ``t`` (the integral of its ramp)."""
        if self.kind != "degrade" or t <= self.start_s:
            return 0.0
        lead = self.end_s - self.start_s
        x = min(1.0, (t - self.start_s) / lead)
        return self.symbol_peak_per_s * lead * (math.expm1(_G * x) / _G - x) / math.expm1(_G)

    def narrowed(self, t: float) -> bool:
        return self.downshift_s is not None and self.downshift_s <= t < self.end_s


@dataclass
class NodeLinks:
    network: Literal["InfiniBand", "RoCE"]
    traffic_share: float  # a busy node's traffic per port, as a share of the port's rate
    ports: tuple[PortPlan, ...]
    faults: list[LinkFault]  # by start time
    by_rail: dict[int, list[LinkFault]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_rail = {}
        for fault in self.faults:
            self.by_rail.setdefault(fault.rail, []).append(fault)

    def slowdown_at(self, t: float) -> float:
        """How many times slower the node's steps run at ``t`` because of its links.

        The slowest rail sets the pace of a collective, so the worst fault counts, not their
        product.
        """
        return max((fault.slowdown_at(t) for fault in self.faults), default=1.0)

    def dead_from(self, rail: int) -> float:
        return min(
            (f.start_s for f in self.by_rail.get(rail, ()) if f.kind == "dead"), default=math.inf
        )


def _poisson_times(rng: np.random.Generator, rate_per_s: float, end_s: float) -> np.ndarray:
    count = rng.poisson(rate_per_s * end_s)
    return np.sort(rng.uniform(0.0, end_s, size=count))


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    low, high = max(low, 1e-9), max(high, 1e-9)
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def build_links(spec: FleetSpec, node: NodePlan, timeline: NodeTimeline) -> NodeLinks:
    """The node's ports and their faults, from the node's own ``Stream.LINKS`` substreams."""
    net = spec.network
    rng = substream(spec.seed, Stream.LINKS, node.index, 0)
    roce = bool(rng.random() < net.roce_node_share)
    traffic_share = float(rng.uniform(*net.traffic_share))
    ports: list[PortPlan] = []
    faults: list[LinkFault] = []
    end_s = spec.horizon_days * DAY
    for rail in range(net.ports_per_node):
        # One substream per port and kind, so that e.g. more flaps leave the degradations as
        # they were.
        constants, flaps, degradations, deaths = (
            substream(spec.seed, Stream.LINKS, node.index, 1 + rail, part) for part in range(4)
        )
        ports.append(_port(constants, spec, rail, roce))
        drawn = _flaps(flaps, spec, rail, end_s)
        drawn += _degradations(degradations, spec, rail, end_s)
        drawn += _deaths(deaths, spec, rail, end_s)
        faults += _kept(drawn, timeline)
    faults.sort(key=lambda f: (f.start_s, f.rail))
    return NodeLinks("RoCE" if roce else "InfiniBand", traffic_share, tuple(ports), faults)


def _port(rng: np.random.Generator, spec: FleetSpec, rail: int, roce: bool) -> PortPlan:
    net = spec.network
    symbol_per_s = float(rng.uniform(*net.symbol_errors_per_port_day)) / DAY
    if rng.random() < 0.3:
        symbol_per_s = 0.0  # a clean link: no symbol errors at all
    guid_low = int(rng.integers(0, 2**32))
    return PortPlan(
        rail=rail,
        device=f"mlx5_{rail}",
        port=1,
        link_layer="Ethernet" if roce else "InfiniBand",
        node_guid=f"{_MELLANOX_OUI}:{guid_low >> 16:04x}:{guid_low & 0xFFFF:04x}",
        netdev=f"eth{rail}" if roce else f"ib{rail}",
        rx_factor=float(rng.uniform(0.97, 1.03)),
        tx_factor=float(rng.uniform(0.97, 1.03)),
        symbol_per_s=symbol_per_s,
        wait_per_word=float(rng.uniform(0.5e-5, 2e-5)),
    )


Group = tuple[LinkFault, ...]


def _flaps(rng: np.random.Generator, spec: FleetSpec, rail: int, end_s: float) -> list[Group]:
    net = spec.network
    low, high = net.flap_downs
    out: list[Group] = []
    for t in _poisson_times(rng, net.flaps_per_port_month / MONTH, end_s):
        count = int(rng.integers(low, high + 1))
        length = rng.uniform(*net.flap_episode_minutes) * MINUTE
        offsets = np.sort(rng.uniform(0.0, length, size=high))
        lasting = rng.uniform(*net.flap_down_seconds, size=high)
        retrains = rng.integers(1, 4, size=high)
        slowdown = round(float(rng.uniform(*net.flap_slowdown)), 3)
        downs: list[tuple[float, float]] = []
        for k in range(count):
            # A link goes down again only once it is back up.
            begin = max(t + offsets[k], downs[-1][1] + 1.0) if downs else t + offsets[k]
            downs.append((_us(begin), _us(begin + lasting[k])))
        recoveries = tuple(a for (a, _), n in zip(downs, retrains, strict=False) for _ in range(n))
        end = max(_us(t + length), downs[-1][1])
        out.append((LinkFault("flap", rail, _us(t), end, slowdown, tuple(downs), recoveries),))
    return out


def _degradations(
    rng: np.random.Generator, spec: FleetSpec, rail: int, end_s: float
) -> list[Group]:
    net = spec.network
    out: list[Group] = []
    for t in _poisson_times(rng, net.degradations_per_port_month / MONTH, end_s):
        length = rng.uniform(*net.degrade_hours) * HOUR
        peak = _log_uniform(rng, *net.degrade_symbol_peak_per_hour) / HOUR
        narrows = rng.random() < net.degrade_downshift_prob
        narrow_at = rng.uniform(0.4, 0.9)
        slowdown = round(float(rng.uniform(*net.degrade_slowdown)), 3)
        dies = rng.random() < net.degrade_dies_prob
        reseat_s = rng.uniform(30.0, 300.0)
        dead_slowdown = round(float(rng.uniform(*net.dead_slowdown)), 3)
        start, end = _us(t), _us(t + length)
        downshift = _us(t + narrow_at * length) if narrows else None
        degrade = LinkFault(
            "degrade",
            rail,
            start,
            end,
            slowdown,
            downs=() if dies else ((end, _us(end + reseat_s)),),
            recoveries=(downshift,) if downshift is not None else (),
            symbol_peak_per_s=peak,
            downshift_s=downshift,
            then_dead=dies,
        )
        out.append(
            (degrade, _dead(rail, end, max(slowdown, dead_slowdown))) if dies else (degrade,)
        )
    return out


def _dead(rail: int, start: float, slowdown: float) -> LinkFault:
    return LinkFault("dead", rail, start, math.inf, slowdown, downs=((start, math.inf),))


def _deaths(rng: np.random.Generator, spec: FleetSpec, rail: int, end_s: float) -> list[Group]:
    net = spec.network
    out: list[Group] = []
    for t in _poisson_times(rng, net.deaths_per_port_month / MONTH, end_s):
        slowdown = round(float(rng.uniform(*net.dead_slowdown)), 3)
        out.append((_dead(rail, _us(t), slowdown),))
    return out


def _kept(drawn: list[tuple[LinkFault, ...]], timeline: NodeTimeline) -> list[LinkFault]:
    """One fault at a time per port, none that begins while the node is down. A group (a
    degradation and the death that ends it) is kept or dropped whole."""
    kept: list[LinkFault] = []
    busy_until = -math.inf
    for group in sorted(drawn, key=lambda g: g[0].start_s):
        first = group[0]
        if first.start_s < busy_until or timeline.is_down(first.start_s):
            continue
        kept += group
        busy_until = max(fault.busy_until_s for fault in group)
    return kept
