"""Training jobs: step reports in, job summaries and straggler verdicts out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetwatch.server.schemas.fields import AwareInstant, Text

__all__ = [
    "CheckpointReport",
    "CheckpointSummary",
    "HardwareFailure",
    "JobEnd",
    "JobEventAccepted",
    "JobStart",
    "RestartReport",
    "RestartSummary",
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
    started_at: datetime | None = Field(default=None, description="As the job reported it")
    ended_at: datetime | None = Field(default=None, description="As the job reported it")
    outcome: Literal["completed", "failed", "cancelled"] | None = Field(
        default=None, description="null while running (or for a job that never said)"
    )


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
    end_reason: str | None = None
    hardware_failure: HardwareFailure | None = Field(
        default=None,
        description="For a failed job: the failure of one of its nodes near its end "
        "(job_failure_before_s .. job_failure_after_s), if any",
    )
    checkpoints: CheckpointSummary | None = None
    restarts: RestartSummary | None = None


# -- issue 14: what a job says of its start, end, checkpoints and restarts --------------------

NodeName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
]
Outcome = Literal["completed", "failed", "cancelled"]


class JobStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    started_at: AwareInstant = Field(description="When the job started, with a UTC offset")
    nodes: list[NodeName] = Field(
        min_length=1, max_length=100_000, description="The nodes the job runs on"
    )
    ranks: int | None = Field(
        default=None, strict=True, ge=1, le=1_000_000, description="Processes (one GPU each)"
    )
    notice_risk_threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Send a risk notice when P(failure within horizon_h) of one of the job's "
        "nodes reaches this (default: the server's notice_risk_threshold)",
    )
    horizon_h: float | None = Field(
        default=None,
        gt=0,
        le=8760,
        description="The horizon of risk notices, hours (default: the server's notice_horizon_h)",
    )


class JobEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcome: Outcome
    ended_at: AwareInstant = Field(description="When the job ended, with a UTC offset")
    reason: Text | None = Field(
        default=None, max_length=1000, description="Why, in the job's words"
    )
    nodes: list[NodeName] | None = Field(
        default=None, max_length=100_000, description="The nodes it ran on, if not sent at start"
    )


class CheckpointReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    started_at: AwareInstant = Field(description="When the checkpoint began (its identity)")
    duration_s: float = Field(
        ge=0, le=7 * 86400, allow_inf_nan=False, description="How long the checkpoint took"
    )
    step: int | None = Field(default=None, strict=True, ge=0, le=2**62)


class RestartReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resumed_at: AwareInstant = Field(description="When training resumed (the restart's identity)")
    interrupted_at: AwareInstant | None = Field(
        default=None, description="When the job stopped; gives the time to recover"
    )
    from_step: int | None = Field(default=None, strict=True, ge=0, le=2**62)
    lost_steps: int | None = Field(
        default=None, strict=True, ge=0, le=2**62, description="Steps redone since the checkpoint"
    )
    lost_s: float | None = Field(
        default=None,
        ge=0,
        le=365 * 86400,
        allow_inf_nan=False,
        description="Seconds of work redone; else lost_steps x the job's mean step time",
    )


class JobEventAccepted(BaseModel):
    job_id: str
    stored: bool = Field(description="false: the same report was stored before (a retry)")


class HardwareFailure(BaseModel):
    node: str
    at: datetime
    kind: Literal["gpu_failure", "drain"]
    detail: str


class CheckpointSummary(BaseModel):
    count: int
    total_s: float | None
    mean_s: float | None
    last_step: int | None


class RestartSummary(BaseModel):
    count: int
    lost_steps: int | None = Field(description="Sum over restarts that reported it")
    lost_s: float | None = Field(description="Sum over restarts that reported it")
    mean_recover_s: float | None = Field(description="Interruption to resume, where reported")


JobDetailPublic.model_rebuild()  # its summaries are declared after it
