"""dcgm-exporter series of a MIG-enabled GPU: one whole-GPU reading out of per-instance copies.

With MIG on, dcgm-exporter 2.x/3.x emits each series of the GPU once per GPU instance, labelled
``GPU_I_ID`` and ``GPU_I_PROFILE``, and none without them (Run:ai's A100 captures: 3 instances,
3 copies of every series); older exporters also emit whole-GPU series beside a few per-instance
ones (NVIDIA's docs capture). Which copies to believe depends on the field family:

- **whole-GPU fields** (temperatures, power, energy, clocks, throttle reasons and times, ECC,
  retired pages, remapped rows, NVLink and PCIe counters, recovery action, the last Xid): DCGM
  reads them from the parent GPU for every instance, so each copy is the same reading taken at
  a slightly different instant (the captures hold copies of the board power 5.8 W apart). They
  are taken once: a whole-GPU series, when there is one, wins; otherwise a counter takes its
  highest copy (the newest reading of a count that only grows), a flag is true when any copy is
  (a remap one copy saw pending is pending), the last Xid is the lowest instance's non-zero code
  (0 only says none was seen), and every other field the copy of the lowest GPU instance id (a
  fixed choice among equally valid readings).
- **per-instance fields**: the framebuffer (``FB_USED``/``FB_FREE``/``FB_TOTAL`` are the
  instance's memory), utilisation (``GPU_UTIL``, ``MEM_COPY_UTIL``: DCGM reports neither under
  MIG; a copy, if one came, would be an instance's) and the profiling fields ``DCGM_FI_PROF_*``
  (per instance by design, and no canonical field). Left **absent**: the instances' memory does
  not add up to the GPU's (telegraf's A100: 4 x 12 MiB in instances, 50 MiB used on the GPU), and
  an average of instance activity weighs slices of different sizes alike, so neither is the
  whole-GPU value and neither is made up.

The GPU instances themselves (id and profile) become the GPU's MIG identity. GPU instances exist
only in MIG mode, so a GPU with any is recorded as ``current: enabled``; the pending mode is not
in the scrape and stays absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetwatch.telemetry import SAMPLE_FIELDS

__all__ = ["PER_INSTANCE_FIELDS", "MigCopies"]

PER_INSTANCE_FIELDS = frozenset(
    {"fb_used_mib", "fb_total_mib", "gpu_util_pct", "mem_copy_util_pct"}
)
_KIND = {spec.name: spec.kind for spec in SAMPLE_FIELDS}


@dataclass
class MigCopies:
    """The per-instance series of one GPU, kept until the whole scrape is read."""

    instances: dict[int, str | None] = field(default_factory=dict)  # GPU instance id -> profile
    values: dict[str, list[tuple[int, int, Any]]] = field(default_factory=dict)
    xids: list[tuple[int, int]] = field(default_factory=list)  # (GPU instance id, code)

    def note_instance(self, gpu_instance_id: int, profile: str | None) -> None:
        if self.instances.get(gpu_instance_id) is None:
            self.instances[gpu_instance_id] = profile

    def add(self, name: str, rank: int, gpu_instance_id: int, value: Any) -> None:
        """One instance's copy of canonical field ``name`` (``rank``: its metric's preference)."""
        if name not in PER_INSTANCE_FIELDS:
            self.values.setdefault(name, []).append((rank, gpu_instance_id, value))

    def whole_gpu_values(self) -> dict[str, Any]:
        """One value per whole-GPU field, chosen from the copies as the module describes."""
        out: dict[str, Any] = {}
        for name, copies in self.values.items():
            best = min(rank for rank, _, _ in copies)
            kept = sorted((gi, value) for rank, gi, value in copies if rank == best)
            kind = _KIND[name]
            if kind == "counter":
                out[name] = max(value for _, value in kept)
            elif kind == "flag":
                out[name] = any(value for _, value in kept)
            else:
                out[name] = kept[0][1]
        return out

    def last_xid(self) -> int | None:
        """The lowest instance's non-zero last-Xid code, else 0; ``None`` without any copy."""
        if not self.xids:
            return None
        return next((code for _, code in sorted(self.xids) if code), 0)

    def identity(self) -> dict[str, Any] | None:
        """The GPU's MIG identity (wire ``GpuIdentity.mig``), or ``None`` without instances."""
        if not self.instances:
            return None
        instances = [
            {"gpu_instance_id": gi} | ({"profile": profile} if profile else {})
            for gi, profile in sorted(self.instances.items())
        ]
        return {"current": "enabled", "instances": instances}
