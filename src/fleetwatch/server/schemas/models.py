"""Risk-model versions as the API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["ModelVersionPublic", "ModelVersionsPublic", "RefitAccepted"]


class ModelVersionPublic(BaseModel):
    version: int
    trained_at: datetime
    trigger: Literal["schedule", "manual", "startup"]
    status: Literal["ok", "failed"]
    metrics: dict[str, Any] | None = Field(
        description="Training size, per-group Weibull shape, scale and MTBF, AFT concordance"
    )
    error: str | None = Field(description="Why the fit failed (status failed)")


class ModelVersionsPublic(BaseModel):
    data: list[ModelVersionPublic]
    count: int


class RefitAccepted(BaseModel):
    accepted: bool = Field(description="A refit started in the background")
