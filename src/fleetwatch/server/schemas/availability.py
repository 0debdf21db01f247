"""Availability figures over a period (issue 14); definitions in
:mod:`fleetwatch.reports.availability` and docs/telling.md."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["AvailabilityFigures", "AvailabilityPublic"]


class AvailabilityFigures(BaseModel):
    nodes: int
    node_hours: float = Field(description="Node-hours of exposure in the period")
    up_h: float
    planned_down_h: float | None = Field(description="null where no maintenance windows are known")
    unplanned_down_h: float
    planned_unplanned_ratio: float | None
    infrastructure_availability: float | None = Field(description="up / exposure")
    workload_availability: float | None = Field(description="up / (exposure - planned)")
    failures: int = Field(description="Outage episodes that began in the period")
    mtbf_h: float | None = Field(description="Up hours / failures")
    mttr_h: float | None = Field(description="Mean length of the episodes that ended")
    repairs: int
    planned_known: bool | None = None


class AvailabilityPublic(BaseModel):
    since: str
    until: str
    fleet: AvailabilityFigures
    by: dict[str, dict[str, AvailabilityFigures]] = Field(
        description="label -> label value -> figures of the nodes with it"
    )
    jobs: dict[str, Any] = Field(description="Ended in the period: outcomes, success rate")
    goodput: dict[str, Any] = Field(description="GPU-hours scheduled, lost (by cause), goodput")
    slow_nodes: dict[str, Any]
    time_to_recover: dict[str, Any] = Field(description="node_back and job_resumed, minutes")
    sla: dict[str, Any] = Field(description="Targets from settings, and whether they were met")
