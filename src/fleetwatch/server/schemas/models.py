"""Risk-model versions as the API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "ChallengerScorePublic",
    "ChampionScorePublic",
    "ModelEvaluationPublic",
    "ModelVersionPublic",
    "ModelVersionsPublic",
    "RefitAccepted",
]


class ChallengerScorePublic(BaseModel):
    auc: float | None = Field(
        description="ROC AUC of the refit's recipe fitted at the window start; null without "
        "both a failure and a survivor, or when it could not be fitted then"
    )
    ap: float | None = Field(description="Average precision, null as auc is")
    ece: float | None = Field(description="Expected calibration error, 10 equal-width bins")
    n: int = Field(description="GPUs in service at the window start")
    failures: int = Field(description="Of those, GPUs that failed in the window")


class ChampionScorePublic(BaseModel):
    version: int = Field(description="The version in service when the refit ran")
    auc: float | None
    ap: float | None
    ece: float | None
    in_sample: bool = Field(
        description="Trained after the window start: it has seen part of the window, which "
        "can only flatter its score"
    )


class ModelEvaluationPublic(BaseModel):
    window_start: datetime
    window_end: datetime
    challenger: ChallengerScorePublic | None = Field(
        description="The refit's scores; null when it did not fit"
    )
    champion: ChampionScorePublic | None = Field(
        description="The version in service, scored on the same GPUs and window; null when "
        "none served"
    )
    promoted: bool
    reason: str = Field(description="Why the refit was promoted, rejected, or not compared")
    scorer: Literal["landmark", "aft", "weibull"] | None = Field(
        default=None,
        description="The part the refit scores by: landmark (gradient-boosted trees on age and "
        "telemetry), aft or weibull; null for versions stored before the choice existed or "
        "not fitted",
    )
    scorer_reason: str | None = Field(default=None, description="Why that part")
    scorers: dict[str, ChallengerScorePublic] = Field(
        default_factory=dict,
        description="Each part of the refit (fitted at the window start) scored on the window",
    )


class ModelVersionPublic(BaseModel):
    version: int
    trained_at: datetime
    trigger: Literal["schedule", "manual", "startup"]
    status: Literal["ok", "failed", "rejected"] = Field(
        description="ok: fitted and promoted; rejected: fitted, but it scored worse than the "
        "version in service on the held-out window; failed: not fitted"
    )
    serving: bool = Field(description="The version in service (the newest ok one)")
    metrics: dict[str, Any] | None = Field(
        description="Training size, per-group Weibull shape, scale and MTBF, AFT concordance, "
        "the landmark model's rows and failures (or why it was not fitted)"
    )
    error: str | None = Field(description="Why the fit failed (status failed)")
    evaluation: ModelEvaluationPublic | None = Field(
        description="The held-out comparison with the version in service; null for versions "
        "stored before it existed"
    )


class ModelVersionsPublic(BaseModel):
    data: list[ModelVersionPublic]
    count: int
    serving: int | None = Field(
        description="The version /v1/risk, notices, the planner and the report use (from their "
        "next assessment); null when none is fitted and the rules alone judge"
    )


class RefitAccepted(BaseModel):
    accepted: bool = Field(description="A refit started in the background")
