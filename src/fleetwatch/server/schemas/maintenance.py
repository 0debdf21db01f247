"""Maintenance windows: the body that opens one, and the window as the API returns it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from fleetwatch.server.concepts.planned import WindowState, parse_selector
from fleetwatch.server.schemas.fields import AwareInstant, Text

__all__ = [
    "MAX_REASON",
    "MaintenanceCreate",
    "MaintenancePublic",
    "MaintenanceState",
    "MaintenancesPublic",
    "NodeMaintenance",
]

MAX_REASON = 500
MaintenanceState = WindowState
# As the wire names nodes (telemetry.NodeInfo.name).
NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")]


class MaintenanceCreate(BaseModel):
    """Exactly one of ``nodes`` and ``selector``."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeName] | None = Field(
        default=None,
        min_length=1,
        max_length=10_000,
        description="the nodes, by name",
        examples=[["gpu-node-017", "gpu-node-018"]],
    )
    selector: Text | None = Field(
        default=None,
        max_length=2000,
        description="instead of nodes: a label selector, label=value[,label=value...]; a node "
        "matches when every label equals its value (labels as the node's agent reports them)",
        examples=["rack=r12"],
    )
    starts_at: AwareInstant | None = Field(default=None, description="when it begins (absent: now)")
    ends_at: AwareInstant | None = Field(
        default=None, description="when it ends (absent: until ended, with DELETE)"
    )
    reason: Text = Field(
        min_length=1, max_length=MAX_REASON, description="why, for the people who see it"
    )
    key: Text | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the caller's own id for it (the adapters use slurm:<reservation>, "
        "kubernetes:<node>); at most one open window per key",
    )

    @field_validator("selector")
    @classmethod
    def _selector_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_selector(value)
        return value

    @field_validator("reason")
    @classmethod
    def _reason_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must say why")
        return value


class MaintenancePublic(BaseModel):
    id: int
    state: MaintenanceState = Field(
        description="upcoming (not begun), active (covers its nodes now), ended, or cancelled "
        "(ended before it began: never took effect)"
    )
    nodes: list[str] | None = Field(description="the named nodes; null for a selector")
    selector: dict[str, str] | None = Field(description="label -> value; null for named nodes")
    covered: list[str] = Field(
        description="the known nodes it covers now (a selector's matches; named nodes as given)"
    )
    starts_at: datetime
    ends_at: datetime | None = Field(description="the planned end; null: until ended")
    reason: str
    key: str | None
    created_by: str = Field(description="the name of the token that opened it")
    created_at: datetime
    ended_at: datetime | None = Field(description="when it was ended (DELETE, or its adapter)")
    ended_by: str | None


class MaintenancesPublic(BaseModel):
    count: int
    data: list[MaintenancePublic]


class NodeMaintenance(BaseModel):
    """The window a node is in, on ``/v1/nodes``."""

    id: int
    reason: str
    starts_at: datetime
    ends_at: datetime | None = Field(description="null: until ended")
