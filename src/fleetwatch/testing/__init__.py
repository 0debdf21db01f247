"""Public test doubles, like httpx's MockTransport: use them to test code that reads GPUs."""

from __future__ import annotations

from fleetwatch.testing.fake_mig import FakeMigDeviceHandle
from fleetwatch.testing.fake_nvml import FakeDeviceHandle, FakeEventSet, FakePynvml

__all__ = ["FakeDeviceHandle", "FakeEventSet", "FakeMigDeviceHandle", "FakePynvml"]
