"""MIG in :class:`~fleetwatch.testing.FakePynvml`: mode, MIG device handles and their ids.

A GPU snapshot with MIG capability carries a ``mig`` key::

    "mig": {"current": 1, "pending": 1, "max_devices": 7,
            "devices": [{"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0,
                         "uuid": "MIG-...", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb"}]}

(``current``/``pending`` are ``NVML_DEVICE_MIG_ENABLE`` (1) or ``..._DISABLE`` (0); a device's
``index`` defaults to its position.) Without the key the GPU has no MIG, and every MIG call about
it raises ``NVMLError_NotSupported``, as NVML does for a GPU that lacks the feature. The fake
models what the MIG calls answer, per the nvml.h documentation of each:

- ``nvmlDeviceGetMigMode`` -> ``[current, pending]`` (a list, as pynvml returns it);
- ``nvmlDeviceGetMaxMigDeviceCount`` -> ``max_devices`` (7 unless set);
- ``nvmlDeviceGetMigDeviceHandleByIndex``: NOT_SUPPORTED while MIG is not enabled now,
  INVALID_ARGUMENT for an index at or past the maximum (or a MIG handle as the parent),
  NOT_FOUND where no MIG device sits at the index;
- ``nvmlDeviceGetGpuInstanceId`` / ``...ComputeInstanceId``: the device's ids for a MIG handle,
  NOT_SUPPORTED for a whole GPU's handle;
- ``nvmlDeviceIsMigDeviceHandle`` -> a ``ctypes.c_uint`` (pynvml returns the ctypes object, not
  its ``.value``: truthiness works, ``== 1`` does not);
- ``nvmlDeviceGetDeviceHandleFromMigDeviceHandle``: the parent's handle, INVALID_ARGUMENT for a
  handle that is no MIG device's.

A MIG device handle answers ``nvmlDeviceGetUUID`` and ``nvmlDeviceGetName`` from its snapshot and
``NVMLError_NotSupported`` to every reading call (the fake models MIG devices for identity only);
any call about it raises ``NVMLError_GpuIsLost`` once its parent GPU is lost.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetwatch.testing._pynvml_api import NVMLError, PynvmlConstants

__all__ = ["FakeMigDeviceHandle", "FakeMigDevices"]

_C = PynvmlConstants
_DEFAULT_MAX_DEVICES = 7  # A100, H100, H200: at most seven GPU instances


@dataclass(eq=False)
class FakeMigDeviceHandle:
    """What ``nvmlDeviceGetMigDeviceHandleByIndex`` returns: one object per MIG device."""

    parent: Any  # the FakeDeviceHandle of the GPU it is carved from
    mig_index: int


class FakeMigDevices:
    """The MIG calls of :class:`~fleetwatch.testing.FakePynvml` (mixed into it)."""

    if TYPE_CHECKING:  # provided by FakePynvml

        def _gpu(self, fn: str, handle: Any) -> dict[str, Any]: ...

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        mig = self._mig("nvmlDeviceGetMigMode", device)
        return [int(mig.get("current", 0)), int(mig.get("pending", mig.get("current", 0)))]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        mig = self._mig("nvmlDeviceGetMaxMigDeviceCount", device)
        return int(mig.get("max_devices", _DEFAULT_MAX_DEVICES))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> FakeMigDeviceHandle:
        mig = self._mig("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if int(mig.get("current", 0)) != _C.NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(_C.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < int(mig.get("max_devices", _DEFAULT_MAX_DEVICES)):
            raise NVMLError(_C.NVML_ERROR_INVALID_ARGUMENT)
        if _device_at(mig, index) is None:
            raise NVMLError(_C.NVML_ERROR_NOT_FOUND)
        return FakeMigDeviceHandle(device, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return int(self._mig_device("nvmlDeviceGetGpuInstanceId", device)["gpu_instance_id"])

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return int(
            self._mig_device("nvmlDeviceGetComputeInstanceId", device)["compute_instance_id"]
        )

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        self._gpu("nvmlDeviceIsMigDeviceHandle", _parent(device))
        return ctypes.c_uint(1 if isinstance(device, FakeMigDeviceHandle) else 0)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        if not isinstance(migDevice, FakeMigDeviceHandle):
            raise NVMLError(_C.NVML_ERROR_INVALID_ARGUMENT)
        self._gpu("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice.parent)
        return migDevice.parent

    # -- internals --------------------------------------------------------------------------

    def _mig(self, fn: str, device: Any) -> dict[str, Any]:
        """The parent GPU's ``mig`` snapshot; a MIG handle is no parent."""
        if isinstance(device, FakeMigDeviceHandle):
            self._gpu(fn, device.parent)
            raise NVMLError(_C.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpu(fn, device)
        if "mig" not in gpu:
            raise NVMLError(_C.NVML_ERROR_NOT_SUPPORTED)
        mig: dict[str, Any] = gpu["mig"]
        return mig

    def _mig_device(self, fn: str, device: Any) -> dict[str, Any]:
        if not isinstance(device, FakeMigDeviceHandle):
            self._gpu(fn, device)
            raise NVMLError(_C.NVML_ERROR_NOT_SUPPORTED)
        return self._mig_device_snapshot(fn, device)

    def _mig_device_snapshot(self, fn: str, handle: FakeMigDeviceHandle) -> dict[str, Any]:
        """The snapshot of the MIG device ``handle`` names (its parent answering for it)."""
        mig = self._gpu(fn, handle.parent).get("mig", {})
        device = _device_at(mig, handle.mig_index)
        if device is None:  # destroyed since the handle was taken
            raise NVMLError(_C.NVML_ERROR_NOT_FOUND)
        return device


def _device_at(mig: dict[str, Any], index: int) -> dict[str, Any] | None:
    for position, device in enumerate(mig.get("devices", ())):
        if int(device.get("index", position)) == index:
            return dict(device)
    return None


def _parent(device: Any) -> Any:
    return device.parent if isinstance(device, FakeMigDeviceHandle) else device
