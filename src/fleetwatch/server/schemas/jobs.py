"""Training jobs: step reports in, job summaries and straggler verdicts out."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetwatch.server.schemas.fields import AwareInstant

__all__ = [
    "JobDetailPublic",
    "JobPublic",
    "JobsPublic",
    "NodeStepStats",
    "StepReport",
    "StepsAccepted",
    "StepsBatch",
    "StragglerPublic",
    "StragglersPublic",
]


class StepReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(strict=True, ge=0, le=1_000_000, description="Global rank of the process")
    node: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    step: int = Field(strict=True, ge=0, le=2**62, description="Training step number")
    duration_ms: float = Field(
        ge=0.001,  # a denormal step time made p99 / p50 infinite, answered as null
        le=86_400_000,
        allow_inf_nan=False,
        description="Wall time of this rank's step, milliseconds (1 µs to 1 day)",
    )
    ts: AwareInstant = Field(description="When the step ended, with a UTC offset")
    stage: int | None = Field(
        default=None, strict=True, ge=0, le=100_000, description="Pipeline-parallel stage"
    )
    dp_group: int | None = Field(
        default=None, strict=True, ge=0, le=10_000_000, description="Data-parallel group"
    )


class StepsBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[StepReport] = Field(min_length=1, max_length=100_000)


class StepsAccepted(BaseModel):
    accepted: int
    job_id: str
    ranks: int
    nodes: int


class JobPublic(BaseModel):
    job_id: str
    first_seen: datetime = Field(description="Time of the job's first reported step")
    last_seen: datetime = Field(description="Time of the job's newest reported step")
    ranks: int = Field(description="Highest rank reported + 1")
    nodes: list[str]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class StragglerPublic(BaseModel):
    id: int
    job_id: str
    node: str
    kind: Literal["hardware", "workload"]
    started_at: datetime = Field(description="Start of the first slow window (the job's clock)")
    updated_at: datetime
    ended_at: datetime | None = Field(description="End of the window that closed it; null: open")
    windows: int = Field(description="Slow windows so far")
    ratio: float = Field(description="Node median step / job median step over the slow windows")
    evidence: dict[str, Any] | None


class StragglersPublic(BaseModel):
    data: list[StragglerPublic]
    count: int


class NodeStepStats(BaseModel):
    node: str
    steps: int
    p50_ms: float
    p99_ms: float
    p99_over_p50: float
    ratio: float = Field(description="p50 / the job's median step over the same window")


class JobDetailPublic(JobPublic):
    window_start: datetime | None = Field(description="The last window: its start (job clock)")
    window_s: float
    job_median_ms: float | None
    node_stats: list[NodeStepStats]
    stragglers: list[StragglerPublic] = Field(description="Open verdicts")
