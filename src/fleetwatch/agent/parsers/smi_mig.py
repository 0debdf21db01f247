"""The MIG part of ``nvidia-smi -q`` (text) and ``-q -x`` (XML): mode and MIG devices.

With MIG mode on, nvidia-smi keeps printing the parent GPU's whole-GPU values (temperature,
power, clocks, ECC) in the GPU's own sections and prints N/A for what the driver cannot read on a
MIG-enabled GPU (utilisation, remapped rows, retired pages; volatile ECC on R510): those stay
absent, as every N/A does. Its ``<mig_devices>`` hold each MIG device's index, GPU instance and
compute instance ids, and per-device readings that are left out: the device's memory use is not
the GPU's (telegraf's A100: four devices at 12 MiB, 50 MiB used on the GPU), and its volatile
SRAM uncorrectable count is not added to the GPU's own ``<ecc_errors>``, which is what is read.
The XML prints neither the profile nor the MIG UUID of a device: they stay absent, never derived
(say from the SM count).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleetwatch.agent.parsers.smi_values import clean, count

__all__ = ["mig_identity", "mig_mode"]

_MODES = {"enabled": "enabled", "disabled": "disabled"}


def mig_mode(raw: str | None) -> str | None:
    """``Enabled``/``Disabled`` as the wire's ``enabled``/``disabled``; N/A is ``None``."""
    return _MODES.get((clean(raw) or "").lower())


def mig_identity(
    current: str | None, pending: str | None, devices: Iterable[dict[str, str | None]] = ()
) -> dict[str, Any] | None:
    """The wire ``GpuIdentity.mig`` as a dict, for a GPU with MIG enabled now or after its next
    reset; ``None`` otherwise. ``devices``: the printed index, gpu_instance_id and
    compute_instance_id of each MIG device (one without a readable GPU instance id is skipped)."""
    mode, after = mig_mode(current), mig_mode(pending)
    if "enabled" not in (mode, after):
        return None
    instances = []
    for device in devices:
        gi = count(device.get("gpu_instance_id"))
        if gi is None:
            continue
        instance: dict[str, int] = {"gpu_instance_id": gi}
        for key in ("compute_instance_id", "index"):
            value = count(device.get(key))
            if value is not None:
                instance[key] = value
        instances.append(instance)
    instances.sort(key=lambda i: (i["gpu_instance_id"], i.get("compute_instance_id", -1)))
    mig: dict[str, Any] = {"instances": instances}
    if mode is not None:
        mig["current"] = mode
    if after is not None:
        mig["pending"] = after
    return mig
