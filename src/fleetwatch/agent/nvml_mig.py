"""MIG through NVML: a GPU's MIG mode and MIG devices, and what NVML stops reporting under MIG.

With MIG enabled, NVML still reads the whole GPU through the parent's handle (temperature, power,
clocks, ECC, NVLink, PCIe), so the adapter's readings of it are whole-GPU readings, taken once.
Some calls answer NOT_SUPPORTED on a MIG-enabled parent instead (utilisation, remapped rows,
retired pages, volatile ECC on some drivers): those fields are *absent while MIG is on*, not a
fault. They are not counted as collector errors nor warned about (one INFO line per GPU says
which), and they are asked again once MIG mode changes, since a GPU with MIG off reports them.

The MIG devices are enumerated every read (MIG instances can be created and destroyed without a
reset): ``nvmlDeviceGetMaxMigDeviceCount`` slots, each either a MIG device (its GPU and compute
instance ids, MIG UUID and name) or NOT_FOUND (a free slot). The profile is the ``MIG <profile>``
suffix of the device's name (NVML names a MIG device "<GPU name> MIG 1g.5gb", as nvidia-smi -L
and CUDA show it); a name without one gives no profile. A GPU whose driver or nvidia-ml-py has no
MIG at all (NOT_SUPPORTED or FUNCTION_NOT_FOUND, or the call missing) is not asked again.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from fleetwatch.agent.textclean import clean_fields
from fleetwatch.errors import CollectorError, DeviceLost, FieldNotSupported, NvmlUnavailable
from fleetwatch.telemetry import GpuIdentity, MigIdentity

if TYPE_CHECKING:
    from fleetwatch.agent.nvml_fields import _Device

__all__ = ["MIG_CALLS", "MigTracker"]

logger = logging.getLogger(__name__)

MIG_CALLS = (
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
)
# "MIG 1g.5gb", "MIG 1g.10gb+me", and "MIG 1c.3g.20gb" for a compute instance smaller than its GI.
_PROFILE = re.compile(r"\bMIG\s+((?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:\+[A-Za-z0-9.]+)*)\s*$")


@dataclass
class MigTracker:
    """Per GPU (by UUID): its MIG mode as last read, and the fields NVML refused while MIG was
    on. ``available``: this nvidia-ml-py has the MIG calls."""

    available: bool = True
    enabled: dict[str, bool] = field(default_factory=dict)
    without_mig: set[str] = field(default_factory=set)
    refused: dict[str, set[str]] = field(default_factory=dict)

    def read(self, dev: _Device) -> dict[str, Any] | None:
        """The GPU's MIG identity (wire ``GpuIdentity.mig`` as a dict), or ``None`` when MIG is
        off now and after reset, or the GPU has none. Sets ``dev.mig_on``."""
        assert dev.uuid is not None
        if not self.available or dev.uuid in self.without_mig:
            return None
        try:
            current, pending = dev.call(dev.lib.nvmlDeviceGetMigMode, dev.handle)
        except FieldNotSupported:
            self.without_mig.add(dev.uuid)
            return None
        enable = dev.lib.NVML_DEVICE_MIG_ENABLE
        dev.mig_on = current == enable
        if dev.mig_on != self.enabled.get(dev.uuid, False):
            dev.refused_before_mig_change = self.refused.pop(dev.uuid, set())
        self.enabled[dev.uuid] = dev.mig_on
        if enable not in (current, pending):
            return None
        return {
            "current": _mode(current, enable),
            "pending": _mode(pending, enable),
            "instances": _instances(dev) if dev.mig_on else [],
        }

    def with_layout(
        self, dev: _Device, gpu: GpuIdentity, disabled: dict[str, set[str]]
    ) -> GpuIdentity:
        """``gpu`` with its MIG layout as read now; when its MIG mode changed, the fields NVML
        refused under the old mode leave ``disabled`` (to be asked again)."""
        assert dev.uuid is not None
        layout = self.read(dev)
        if dev.refused_before_mig_change:
            disabled.get(dev.uuid, set()).difference_update(dev.refused_before_mig_change)
        if layout is None:
            return gpu
        try:
            mig = MigIdentity(**clean_fields(layout))
        except ValidationError as exc:
            raise CollectorError(f"implausible MIG layout: {exc}") from exc
        return gpu.model_copy(update={"mig": mig})

    def absent_under_mig(self, dev: _Device, fields: tuple[str, ...]) -> None:
        """NVML refused ``fields`` of a MIG-enabled GPU: absent until its MIG mode changes."""
        assert dev.uuid is not None
        self.refused.setdefault(dev.uuid, set()).update(fields)
        dev.absent_under_mig.extend(fields)

    @staticmethod
    def log_absent(dev: _Device) -> None:
        if dev.absent_under_mig:  # INFO, once per GPU and MIG mode: no fault to warn of
            logger.info(
                "GPU %s (index %d) has MIG enabled: NVML does not report %s on it; absent "
                "while MIG is on",
                dev.uuid,
                dev.index,
                ", ".join(dev.absent_under_mig),
            )


def _mode(value: int, enable: int) -> str:
    return "enabled" if value == enable else "disabled"


def _instances(dev: _Device) -> list[dict[str, Any]]:
    lib, out = dev.lib, []
    for index in range(dev.call(lib.nvmlDeviceGetMaxMigDeviceCount, dev.handle)):
        try:
            handle = dev.call(lib.nvmlDeviceGetMigDeviceHandleByIndex, dev.handle, index)
            instance: dict[str, Any] = {
                "index": index,
                "gpu_instance_id": dev.call(lib.nvmlDeviceGetGpuInstanceId, handle),
            }
        except (DeviceLost, NvmlUnavailable):
            raise
        except CollectorError:
            continue  # NOT_FOUND: a free slot (or a device destroyed meanwhile)
        instance |= _optional(dev, handle)
        out.append(instance)
    out.sort(key=lambda i: (i["gpu_instance_id"], i.get("compute_instance_id", -1)))
    return out


def _optional(dev: _Device, handle: Any) -> dict[str, Any]:
    """What else NVML tells of a MIG device; a part it cannot tell stays absent."""
    found: dict[str, Any] = {}
    for key, call in (
        ("compute_instance_id", dev.lib.nvmlDeviceGetComputeInstanceId),
        ("uuid", dev.lib.nvmlDeviceGetUUID),
        ("name", dev.lib.nvmlDeviceGetName),
    ):
        try:
            found[key] = dev.call(call, handle)
        except (DeviceLost, NvmlUnavailable):
            raise
        except CollectorError:
            continue
    name = found.pop("name", None)
    profile = _PROFILE.search(name) if isinstance(name, str) else None
    if profile is not None:
        found["profile"] = profile[1]
    if not (isinstance(found.get("uuid"), str) and found["uuid"].startswith("MIG-")):
        found.pop("uuid", None)
    return found
