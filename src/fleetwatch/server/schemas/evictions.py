"""Eviction documents: what schedulers read and the bodies of their acknowledgements.

The shape of :class:`EvictionPublic` is a contract: the Slurm and Kubernetes adapters code
against it. Add fields only; never rename or remove one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from fleetwatch.server.schemas.fields import Text

__all__ = [
    "STATES",
    "AckBody",
    "ApproveBody",
    "AuditPublic",
    "EvictionDetail",
    "EvictionPublic",
    "EvictionsPublic",
    "RejectBody",
    "ReturnBody",
    "State",
]

State = Literal[
    "pending", "acked", "completed", "returned", "rejected", "cancelled", "paged", "recommended"
]
STATES: tuple[str, ...] = State.__args__  # type: ignore[attr-defined]


class EvictionPublic(BaseModel):
    id: int
    node: str
    state: State = Field(
        description="pending (drain it) -> acked (a scheduler claimed it) -> completed (drained) "
        "-> returned (back in service); or rejected, cancelled (its reason cleared), paged (the "
        "fleet drain budget was full: a person decides), recommended (dry run, never drained)"
    )
    reason_kind: Literal["rule", "risk", "straggler"]
    reason: str = Field(description="one line: what was seen, e.g. the Xid and its GPU")
    evidence: dict[str, Any] | None = Field(
        description="the verdicts, or the probability and its factors, or the straggler's stats"
    )
    expected_saving_usd: float | None = Field(
        description="expected cost avoided by draining minus the cost of the drain"
    )
    dry_run: bool
    created_at: datetime
    updated_at: datetime
    claimed_by: str | None = Field(description="name of the scheduler token that acked it")
    lease_expires_at: datetime | None = Field(
        description="an ack holds until then; after it, another scheduler may claim it"
    )
    completed_at: datetime | None
    returned_at: datetime | None
    detail: str | None = Field(description="the rejection reason or the return note")
    repeat_of: int | None = Field(
        default=None,
        description="a repeat offender: this hardware eviction came within "
        "repeat_offender_days of the node's return from that eviction",
    )


class EvictionsPublic(BaseModel):
    count: int
    data: list[EvictionPublic]
    cursor: int = Field(
        description="where the evictions' change history stood when this list was read; pass "
        "it back as `changed_after` to hear only of later changes"
    )


class AuditPublic(BaseModel):
    ts: datetime
    from_state: str | None
    to_state: str
    actor: str = Field(description="planner, or the name of the token that made the change")
    detail: dict[str, Any] | None


class EvictionDetail(EvictionPublic):
    audit: list[AuditPublic] = Field(description="every state change, oldest first")


class AckBody(BaseModel):
    lease_s: float = Field(
        default=300.0, gt=0, le=86400, description="how long the claim holds without completing"
    )


class RejectBody(BaseModel):
    reason: Text = Field(min_length=1, max_length=2000, description="why the drain is refused")


class ApproveBody(BaseModel):
    note: Text = Field(min_length=1, max_length=2000, description="why it must drain anyway")


class ReturnBody(BaseModel):
    note: Text | None = Field(default=None, max_length=2000, description="what was done")
    force: bool = Field(
        default=False,
        description="return a node evicted for a hardware reason without a passing validation "
        "(admin token only; needs `reason`, which is audited)",
    )
    reason: Text | None = Field(
        default=None, min_length=1, max_length=2000, description="why it is forced"
    )

    @model_validator(mode="after")
    def _force_needs_reason(self) -> ReturnBody:
        if self.force and not (self.reason or "").strip():
            raise ValueError("reason is required with force: who decided it and why")
        return self
