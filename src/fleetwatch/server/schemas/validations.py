"""Validation documents: a node's ``fleetwatch validate`` results as the server keeps them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ValidationPublic", "ValidationsPublic"]


class ValidationPublic(BaseModel):
    id: int
    node: str
    received_at: datetime = Field(description="the server's clock: what the return gate compares")
    started_at: datetime = Field(description="the node's clock")
    finished_at: datetime = Field(description="the node's clock")
    passed: bool = Field(description="no check failed and at least one passed")
    failed: list[str] = Field(description="the failed checks, e.g. 'nvml.ecc_volatile on GPU 3'")
    checks: list[dict[str, Any]] = Field(
        description="every check: name, status (pass, fail, warn, skip, absent), gpu_index, "
        "gpu_uuid, evidence, message"
    )
    tools: dict[str, str] = Field(description="versions: fleetwatch, driver, dcgm")
    dcgm_level: int | None = Field(description="the dcgmi diag level run, if dcgmi ran")
    duration_s: float
    pushed_by: str = Field(description="name of the token that pushed it")


class ValidationsPublic(BaseModel):
    count: int
    data: list[ValidationPublic]
