"""Telemetry covariates of the survival models: hourly rollups and trailing-window features.

Raw samples arrive every few seconds; a model covariate is a summary over days. One hour of one
GPU's samples folds into an :class:`HourRollup` (the server keeps them in ``gpu_hourly``, the
simulator backtest builds them in memory), and :func:`window_features` sums the rollups of a
trailing window into the covariates named in :data:`FEATURE_NAMES`. Both sides use these
functions, so the model is scored on the same numbers it was fitted on.

A covariate the GPU never reported in the window is left out of the result, never set to 0; the
model decides how to handle it (see :mod:`fleetwatch.models.registry`). Xid counts are an
exception: no Xid event in an hour the GPU reported telemetry is a true zero. Application Xids
are not counted: they say nothing about the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog

__all__ = [
    "FEATURE_NAMES",
    "GPU_CATEGORIES",
    "HourRollup",
    "rollup_hour",
    "window_features",
]

# Xid categories that count against a GPU (application Xids never do).
GPU_CATEGORIES = ("hardware", "memory", "interconnect", "power_thermal", "driver_firmware")

FEATURE_NAMES: tuple[str, ...] = (
    "sbe_per_day",
    "remapped_rows",
    *(f"xid_{c}" for c in GPU_CATEGORIES),
    "temp_p95_c",
    "throttle_fraction",
    "nvlink_errors_per_day",
    "pcie_replays_per_day",
)

_NVLINK_COUNTERS = (
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)
_THROTTLE_MASK = HealthThresholds().throttle_mask
_DAY_S = 86400.0


@dataclass
class HourRollup:
    """One GPU's telemetry over one UTC hour (the columns of ``gpu_hourly``)."""

    gpu_uuid: str
    hour: datetime
    samples: int
    span_s: float
    temp_p95_c: float | None = None
    temp_max_c: float | None = None
    throttle_reported: int = 0
    throttled: int = 0
    sbe_errors: float | None = None
    nvlink_errors: float | None = None
    pcie_replays: float | None = None
    remapped_rows: int | None = None
    xids: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GPU_CATEGORIES, 0))

    def as_row(self) -> dict[str, Any]:
        """The ``gpu_hourly`` columns (without ``node_id``)."""
        row = {k: v for k, v in vars(self).items() if k != "xids"}
        row.update({f"xid_{c}": self.xids.get(c, 0) for c in GPU_CATEGORIES})
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> HourRollup:
        names = (
            "gpu_uuid",
            "hour",
            "samples",
            "span_s",
            "temp_p95_c",
            "temp_max_c",
            "throttle_reported",
            "throttled",
            "sbe_errors",
            "nvlink_errors",
            "pcie_replays",
            "remapped_rows",
        )
        return cls(
            **{n: row[n] for n in names},
            xids={c: int(row[f"xid_{c}"]) for c in GPU_CATEGORIES},
        )


def _value(sample: Any, name: str) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name)
    return getattr(sample, name, None)


def _increase(values: Sequence[float | None]) -> float | None:
    """Counter increase over consecutive readings; a drop is a reset (count from zero again)."""
    total: float | None = None
    previous: float | None = None
    for v in values:
        if v is None:
            continue
        if previous is not None:
            total = (total or 0.0) + (v - previous if v >= previous else v)
        previous = v
    return total


def _summed_counters(samples: Sequence[Any], names: Sequence[str]) -> list[float | None]:
    out: list[float | None] = []
    for s in samples:
        parts = [_value(s, n) for n in names]
        known = [float(p) for p in parts if p is not None]
        out.append(sum(known) if known else None)
    return out


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    # Nearest-rank percentile: a reading that actually occurred, not an interpolation.
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def rollup_hour(
    gpu_uuid: str,
    hour: datetime,
    samples: Sequence[Any],
    xids: Iterable[int],
    *,
    catalog: XidCatalog,
) -> HourRollup:
    """Fold one hour of one GPU's samples (oldest first; mappings or ``GpuSample``) and the Xid
    codes logged against it in that hour into a rollup."""
    stamps = [_value(s, "ts") for s in samples]
    span = (max(stamps) - min(stamps)).total_seconds() if len(stamps) > 1 else 0.0
    temps = [float(t) for s in samples if (t := _value(s, "gpu_temp_c")) is not None]
    reasons = [r for s in samples if (r := _value(s, "clocks_event_reasons")) is not None]
    remapped: list[int] = []
    for s in samples:
        corr = _value(s, "remapped_rows_correctable")
        uncorr = _value(s, "remapped_rows_uncorrectable")
        if corr is not None or uncorr is not None:
            remapped.append(int(corr or 0) + int(uncorr or 0))
    counts = dict.fromkeys(GPU_CATEGORIES, 0)
    for code in xids:
        entry = catalog.lookup(code)
        if entry.category in counts:
            counts[entry.category] += 1
    return HourRollup(
        gpu_uuid=gpu_uuid,
        hour=hour,
        samples=len(samples),
        span_s=span,
        temp_p95_c=_p95(temps) if temps else None,
        temp_max_c=max(temps) if temps else None,
        throttle_reported=len(reasons),
        throttled=sum(1 for r in reasons if int(r) & _THROTTLE_MASK),
        sbe_errors=_increase([_value(s, "ecc_sbe_aggregate_total") for s in samples]),
        nvlink_errors=_increase(_summed_counters(samples, _NVLINK_COUNTERS)),
        pcie_replays=_increase([_value(s, "pcie_replay_total") for s in samples]),
        remapped_rows=remapped[-1] if remapped else None,
        xids=counts,
    )


def _rate_per_day(rollups: Sequence[HourRollup], attr: str) -> float | None:
    known = [r for r in rollups if getattr(r, attr) is not None and r.span_s > 0]
    span = sum(r.span_s for r in known)
    if not known or span <= 0:
        return None
    return float(sum(getattr(r, attr) for r in known)) / span * _DAY_S


def window_features(rollups: Sequence[HourRollup]) -> dict[str, float]:
    """Covariates over the rollups of one GPU's trailing window (any order).

    Rates are per day of observed time; ``temp_p95_c`` is the highest hourly p95 (a GPU that ran
    hot for an hour ran hot); ``remapped_rows`` is the highest reading (remaps only accumulate on
    a GPU, and the highest survives a window whose newest hour did not report it). Covariates
    without any reading are absent; with no rollups at all the result is empty.
    """
    if not rollups:
        return {}
    ordered = sorted(rollups, key=lambda r: r.hour)
    out: dict[str, float] = {
        f"xid_{c}": float(sum(r.xids.get(c, 0) for r in ordered)) for c in GPU_CATEGORIES
    }
    rates = {
        "sbe_per_day": "sbe_errors",
        "nvlink_errors_per_day": "nvlink_errors",
        "pcie_replays_per_day": "pcie_replays",
    }
    for name, attr in rates.items():
        if (rate := _rate_per_day(ordered, attr)) is not None:
            out[name] = rate
    temps = [r.temp_p95_c for r in ordered if r.temp_p95_c is not None]
    if temps:
        out["temp_p95_c"] = max(temps)
    reported = sum(r.throttle_reported for r in ordered)
    if reported:
        out["throttle_fraction"] = sum(r.throttled for r in ordered) / reported
    remapped = [r.remapped_rows for r in ordered if r.remapped_rows is not None]
    if remapped:
        out["remapped_rows"] = float(max(remapped))
    return out
