"""The simulated fleet of ``benchmarks/fleet_scale.py``: one set of values, read two ways.

Every GPU reports all canonical fields (:data:`fleetwatch.telemetry.SAMPLE_FIELDS`) every tick.
The agents' JSON pushes (:class:`PushRenderer`) and the dcgm-exporter pages
(``scale_exporters.py``) are built from the same :class:`Fleet`, so FleetWatch and Prometheus
store the same values.

To keep the load generator cheap, values come from profiles shared by many GPUs. A profile holds
``variants`` ticks of gauge values (tick ``t`` shows variant ``t % variants``) and counters that
grow at fixed rates, ``value(t) = base + floor(rate * t)``; each GPU has its own energy counter.
Sharing profiles changes nothing that either store keeps: PostgreSQL stores each row apart and
Prometheus compresses each series apart. One difference is forced by static pages: they hold
ticks ``0 .. variants - 1`` only, so Prometheus sees the counters start again every ``variants``
ticks, where the agents' counters keep growing.

The values are healthy by the server's rules (no NVLink replays or recoveries, single-bit ECC
far below 10 a minute, temperatures below slowdown, no throttle reasons the rules count): only
the injected Xid 79 should make a node drain. The noise is application Xids (13, 31, 43, 45).
"""

from __future__ import annotations

import json
import math
import random
import uuid as uuidlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["NOISE_XIDS", "Fleet", "Gpu", "PushRenderer", "format_ts"]

NOISE_XIDS = {
    13: "Graphics Exception: ESR 0x404490=0x80000001",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_5c000000",
    43: "Ch 00000010, engmask 00000101",
    45: "Ch 00000010, errorString CTX SWITCH TIMEOUT",
}
_GPU_NAME = "NVIDIA H100 80GB HBM3"
_DRIVER = "550.90.07"


@dataclass(frozen=True)
class Gpu:
    node: str
    index: int
    uuid: str
    serial: str
    pci_bus_id: str
    profile: int
    energy_base: int

    def identity(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "serial": self.serial,
            "pci_bus_id": self.pci_bus_id,
            "name": _GPU_NAME,
            "driver_version": _DRIVER,
            "vbios_version": "96.00.99.00.01",
        }


@dataclass(frozen=True)
class _Counter:
    name: str
    base: int
    rate: float  # per tick


@dataclass(frozen=True)
class _Profile:
    fixed: tuple[dict[str, Any], ...]  # per variant: every field that is not a growing counter
    growing: tuple[_Counter, ...]  # energy_mj's base is the GPU's own
    energy_rate: int


class Fleet:
    """``nodes`` nodes of ``gpus_per_node`` GPUs, their identities and values, from ``seed``."""

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int = 8,
        *,
        seed: int = 12,
        tick_s: float = 10.0,
        variants: int = 6,
        profiles: int = 512,
        prefix: str = "scale-n",
    ) -> None:
        self.nodes, self.gpus_per_node, self.seed = nodes, gpus_per_node, seed
        self.tick_s, self.variants, self.prefix = tick_s, variants, prefix
        rng = random.Random(seed)
        self.profiles = [_make_profile(rng, variants, tick_s) for _ in range(profiles)]
        self._fixed_json: dict[int, list[str]] = {}

    def node_name(self, i: int) -> str:
        return f"{self.prefix}{i:05d}"

    def boot_id(self, i: int) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"boot/{self.seed}/{self.node_name(i)}"))

    def gpus(self, i: int) -> list[Gpu]:
        name = self.node_name(i)
        rng = random.Random(f"{self.seed}/{name}")
        out = []
        for index in range(self.gpus_per_node):
            uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{self.seed}/{name}/{index}')}"
            out.append(
                Gpu(
                    node=name,
                    index=index,
                    uuid=uuid,
                    serial=f"1652{rng.randrange(10**9):09d}",
                    pci_bus_id=f"0000:{0x18 + 0x10 * index:02x}:00.0",
                    profile=rng.randrange(len(self.profiles)),
                    energy_base=rng.randrange(10**9, 10**11),
                )
            )
        return out

    def fixed_json(self, profile: int) -> list[str]:
        """Per variant, the profile's fields that do not grow as a JSON fragment (shared by every
        renderer: 12,500 nodes hold one copy)."""
        cached = self._fixed_json.get(profile)
        if cached is None:
            variants = self.profiles[profile].fixed
            cached = self._fixed_json[profile] = ['",' + _dumps(v)[1:-1] for v in variants]
        return cached

    def values(self, gpu: Gpu, t: int) -> dict[str, Any]:
        """Every canonical field of ``gpu`` at tick ``t`` (ticks count from 0)."""
        profile = self.profiles[gpu.profile]
        out = dict(profile.fixed[t % self.variants])
        out["energy_mj"] = gpu.energy_base + profile.energy_rate * t
        for counter in profile.growing:
            out[counter.name] = counter.base + math.floor(counter.rate * t)
        return out


def _make_profile(rng: random.Random, variants: int, tick_s: float) -> _Profile:
    fixed: list[dict[str, Any]] = []
    sbe_base = rng.choice((0, 0, 0, rng.randrange(1, 40)))
    constant: dict[str, Any] = {
        "ecc_sbe_volatile_total": sbe_base,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": sbe_base + rng.randrange(0, 200),
        "ecc_dbe_aggregate_total": 0,
        "retired_pages_sbe": rng.choice((0, 0, 0, 1, 2)),
        "retired_pages_dbe": 0,
        "retired_pages_pending": False,
        "remapped_rows_correctable": rng.choice((0, 0, 0, 1, 3)),
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "power_violation_us": rng.randrange(0, 10**8),
        "thermal_violation_us": rng.choice((0, 0, rng.randrange(0, 10**6))),
        "nvlink_crc_flit_errors_total": rng.randrange(0, 500),
        "nvlink_crc_data_errors_total": rng.randrange(0, 20),
        "nvlink_replay_errors_total": rng.randrange(0, 4),
        "nvlink_recovery_errors_total": rng.choice((0, 0, 0, 1)),
        "pcie_replay_total": rng.randrange(0, 3),
        "gpu_recovery_action": 0,
        "power_limit_w": 700.0,
        "mem_clock_mhz": 2619,
        "fb_total_mib": 81559,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
    }
    watts = []
    for _ in range(variants):
        util = min(100, max(0, round(rng.gauss(92, 8))))
        power = round(min(700.0, 90.0 + 6.0 * util + rng.uniform(-20, 20)), 3)
        watts.append(power)
        throttled = rng.random() < 0.05
        temp = 38 + util // 3 + rng.randrange(-2, 3)
        fixed.append(
            {
                **constant,
                "gpu_temp_c": temp,
                "memory_temp_c": temp + rng.randrange(3, 9),
                "power_w": power,
                "sm_clock_mhz": rng.choice((1755, 1830, 1905)) if throttled else 1980,
                # 0x4: software power cap, which the throttle rule does not count.
                "clocks_event_reasons": 4 if throttled else 0,
                "fan_speed_pct": rng.randrange(30, 60),
                "gpu_util_pct": util,
                "mem_copy_util_pct": max(0, util - rng.randrange(20, 50)),
                "fb_used_mib": 60_000 + rng.randrange(0, 15_000),
            }
        )
    # Counters that grow during the run: power throttling on a fifth of the profiles, a slow
    # single-bit ECC trickle (at most 1.2 a minute; the rule's limit is 10) and NVLink flit CRC
    # errors (at most 0.05/s; the limit is 100/s) on a few.
    growing = []
    if rng.random() < 0.2:
        growing.append(_Counter("power_violation_us", constant["power_violation_us"], 25_000.0))
    if rng.random() < 0.05:
        rate = rng.uniform(0.01, 0.2)
        growing.append(_Counter("ecc_sbe_volatile_total", sbe_base, rate))
        growing.append(
            _Counter("ecc_sbe_aggregate_total", constant["ecc_sbe_aggregate_total"], rate)
        )
    if rng.random() < 0.05:
        base = constant["nvlink_crc_flit_errors_total"]
        growing.append(_Counter("nvlink_crc_flit_errors_total", base, rng.uniform(0.05, 0.5)))
    energy_rate = round(sum(watts) / len(watts) * tick_s * 1000)
    fixed_without_growing = tuple(
        {k: v for k, v in variant.items() if k not in {c.name for c in growing}}
        for variant in fixed
    )
    return _Profile(fixed_without_growing, tuple(growing), energy_rate)


def format_ts(wall_s: float) -> str:
    """RFC 3339 UTC with milliseconds, as agents send it."""
    text = datetime.fromtimestamp(wall_s, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


class PushRenderer:
    """One node's ``POST /v1/ingest`` bodies, pre-built but for what changes between pushes: the
    batch id, the timestamps, the growing counters and the events. Rendering a 48-row push costs
    tens of microseconds, so the load generator leaves the cores to the server."""

    def __init__(self, fleet: Fleet, i: int, push_interval_s: float) -> None:
        self.fleet = fleet
        self.name = fleet.node_name(i)
        self.gpus = fleet.gpus(i)
        node: dict[str, Any] = {
            "name": self.name,
            "labels": {"cluster": "scale", "rack": f"r{i // 32:04d}", "row": str(i // 1024)},
            "interval_s": fleet.tick_s,
            "agent_version": "0.1.0",
            "boot_id": fleet.boot_id(i),
        }
        if push_interval_s > fleet.tick_s:
            node["push_interval_s"] = push_interval_s
        self._middle = (
            '","node":'
            + _dumps(node)
            + ',"gpus":'
            + _dumps([g.identity() for g in self.gpus])
            + ',"samples":['
        )
        # Per GPU: the sample's opening, and per variant the fields that do not grow.
        self._openings = [f'{{"uuid":"{g.uuid}","ts":"' for g in self.gpus]
        self._fixed = [fleet.fixed_json(g.profile) for g in self.gpus]
        self._growing = [
            [
                (',"energy_mj":', g.energy_base, float(fleet.profiles[g.profile].energy_rate)),
                *((f',"{c.name}":', c.base, c.rate) for c in fleet.profiles[g.profile].growing),
            ]
            for g in self.gpus
        ]

    def render(
        self,
        batch_id: str,
        ticks: list[tuple[int, str]],
        events: list[dict[str, Any]] | None = None,
    ) -> bytes:
        """The JSON body: samples of every GPU at each ``(tick index, timestamp)``."""
        parts = ['{"batch_id":"', batch_id, self._middle]
        variants = self.fleet.variants
        first = True
        for t, ts in ticks:
            v = t % variants
            for opening, fixed, growing in zip(
                self._openings, self._fixed, self._growing, strict=True
            ):
                if not first:
                    parts.append(",")
                first = False
                parts.append(opening)
                parts.append(ts)
                parts.append(fixed[v])
                for key, base, rate in growing:
                    parts.append(key)
                    parts.append(str(base + math.floor(rate * t)))
                parts.append("}")
        parts.append('],"events":')
        parts.append(_dumps(events or []))
        parts.append("}")
        return "".join(parts).encode()

    def noise_event(self, rng: random.Random, ts: str) -> dict[str, Any]:
        """An application Xid on one of the node's GPUs: what every fleet sees all day."""
        gpu = rng.choice(self.gpus)
        xid = rng.choice(sorted(NOISE_XIDS))
        return {
            "kind": "xid",
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "xid": xid,
            "ts": ts,
            "message": NOISE_XIDS[xid],
            "pid": rng.randrange(1000, 4_000_000),
            "process": "python",
        }

    def fatal_xid(self, rng: random.Random, ts: str) -> dict[str, Any]:
        """Xid 79 on one of the node's GPUs: the node must drain."""
        gpu = rng.choice(self.gpus)
        return {
            "kind": "xid",
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "xid": 79,
            "ts": ts,
            "message": "GPU has fallen off the bus.",
        }


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
