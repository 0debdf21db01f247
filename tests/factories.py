"""Builders of wire-format batches for tests: valid by default, every field overridable."""

from __future__ import annotations

import uuid as uuidlib
from datetime import UTC, datetime, timedelta
from typing import Any


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{index}')}"


def make_gpu(node: str = "node-a", index: int = 0, **overrides: Any) -> dict[str, Any]:
    gpu = {
        "uuid": gpu_uuid(node, index),
        "index": index,
        "serial": f"1650{abs(hash((node, index))) % 10**9:09d}",
        "pci_bus_id": f"0000:{0x18 + index:02x}:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "550.90.07",
        "vbios_version": "96.00.99.00.01",
    }
    gpu.update(overrides)
    return gpu


def make_sample(uuid: str, ts: datetime | None = None, **overrides: Any) -> dict[str, Any]:
    sample = {
        "uuid": uuid,
        "ts": (ts or datetime.now(UTC)).isoformat(),
        "gpu_temp_c": 41.0,
        "memory_temp_c": 48.0,
        "power_w": 312.5,
        "power_limit_w": 700.0,
        "energy_mj": 123_456_789,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "clocks_event_reasons": 0,
        "gpu_util_pct": 97.0,
        "fb_used_mib": 60_000.0,
        "fb_total_mib": 81_559.0,
        "ecc_sbe_volatile_total": 0,
        "ecc_dbe_volatile_total": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "nvlink_crc_flit_errors_total": 0,
        "pcie_replay_total": 0,
    }
    sample.update(overrides)
    return sample


def make_batch(
    node: str = "node-a",
    gpus: int = 2,
    ticks: int = 1,
    *,
    start: datetime | None = None,
    interval_s: float = 10.0,
    events: list[dict[str, Any]] | None = None,
    boot_id: str = "boot-1",
    batch_id: str | None = None,
    **node_overrides: Any,
) -> dict[str, Any]:
    start = start or datetime.now(UTC) - timedelta(seconds=interval_s * ticks)
    gpu_list = [make_gpu(node, i) for i in range(gpus)]
    samples = [
        make_sample(g["uuid"], start + timedelta(seconds=interval_s * t))
        for t in range(ticks)
        for g in gpu_list
    ]
    node_info = {
        "name": node,
        "labels": {"cluster": "test", "rack": "r1"},
        "interval_s": interval_s,
        "agent_version": "test",
        "boot_id": boot_id,
    }
    node_info.update(node_overrides)
    return {
        "batch_id": batch_id or str(uuidlib.uuid4()),
        "node": node_info,
        "gpus": gpu_list,
        "samples": samples,
        "events": events or [],
    }


def make_validation(
    node: str = "node-a", *, failing: tuple[str, ...] = (), gpus: int = 2, **overrides: Any
) -> dict[str, Any]:
    """A ``fleetwatch validate`` result as pushed: every NVML check passing on ``gpus`` GPUs,
    except the check names in ``failing`` (failed on GPU 0)."""
    now = datetime.now(UTC)
    names = ("nvml.remapped_rows", "nvml.ecc_volatile", "nvml.pcie_link", "nvml.clocks_idle")
    checks = [
        {
            "name": name,
            "status": "fail" if name in failing and index == 0 else "pass",
            "gpu_index": index,
            "gpu_uuid": gpu_uuid(node, index),
            "evidence": {},
        }
        for index in range(gpus)
        for name in names
    ]
    report = {
        "node": node,
        "started_at": (now - timedelta(seconds=30)).isoformat(),
        "finished_at": now.isoformat(),
        "checks": checks,
        "tools": {"fleetwatch": "test"},
        "duration_s": 30.0,
    }
    report.update(overrides)
    return report


def store_validation_now(conn: Any, node: str, *, failing: tuple[str, ...] = ()) -> None:
    """A validation of ``node`` received now, written straight to the database."""
    from fleetwatch.server.db.base import utcnow
    from fleetwatch.server.repo.validations import store_validation
    from fleetwatch.validation_wire import ValidationReport

    report = ValidationReport.model_validate(make_validation(node, failing=failing))
    store_validation(conn, report, pushed_by="test-agent", now=utcnow())
