"""GPU lifetimes (install to failure, repair or retirement) as the API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

__all__ = ["LifetimePublic", "LifetimesPublic"]


class LifetimePublic(BaseModel):
    id: int
    serial: str
    gpu_uuid: str | None
    node_id: int | None
    location: str | None
    sku: str | None
    installed_at: datetime
    removed_at: datetime | None
    end_kind: str | None
    cause: str | None
    evidence: dict[str, Any] | None
    source: str


class LifetimesPublic(BaseModel):
    data: list[LifetimePublic]
    count: int
