"""What a training job is told about its nodes (GET /v1/jobs/{id}/notices)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["NoticeAction", "NoticeKind", "NoticePublic", "NoticesPublic"]

NoticeKind = Literal["drain_pending", "gpu_out", "risk", "cleared"]
NoticeAction = Literal["checkpoint_now", "checkpoint_and_exit", "continue"]


class NoticePublic(BaseModel):
    id: int = Field(description="The job's cursor: ask again with after=<the newest id read>")
    job_id: str
    kind: NoticeKind
    node: str
    gpu: str | None = Field(description="GPU UUID, when the notice is about one GPU")
    reason: str
    evidence: dict[str, Any] | None
    action: NoticeAction = Field(
        description="checkpoint_now: save a checkpoint at the next step boundary; "
        "checkpoint_and_exit: save one and stop, the node is leaving; continue: nothing to do"
    )
    opened_at: datetime
    cleared_at: datetime | None = Field(description="When it stopped holding; null while open")
    clears: int | None = Field(description="For a cleared notice: the id of the notice it clears")


class NoticesPublic(BaseModel):
    job_id: str
    count: int
    data: list[NoticePublic] = Field(description="Notices with id > after, oldest first")
    cursor: int = Field(description="The newest id read; pass it back as after")
    open: int = Field(description="Notices of this job open now (whatever after says)")
