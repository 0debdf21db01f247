"""Nodes, GPUs, samples and events as the read API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from fleetwatch.server.schemas.maintenance import NodeMaintenance
from fleetwatch.telemetry import MigIdentity

__all__ = [
    "EventPublic",
    "EventsPublic",
    "GpuDetail",
    "GpuSummary",
    "LatestSample",
    "NodeDetail",
    "NodePublic",
    "NodesPublic",
    "SamplePoint",
    "SamplesPublic",
]

NodeState = Literal["up", "unheard", "unreachable", "maintenance"]


class NodePublic(BaseModel):
    name: str
    state: NodeState = Field(
        description="unreachable when silent for 3 x interval_s while the server was up; "
        "unheard while silent that long only counting from before the server started (its "
        "grace after a restart: not known to be up, not called unreachable yet; the same for "
        "its intervals after a maintenance window ends); maintenance while a maintenance window "
        "covers it (its silence is planned)"
    )
    last_seen: datetime
    first_seen: datetime
    labels: dict[str, str]
    interval_s: float
    agent_version: str | None
    gpu_count: int
    maintenance: NodeMaintenance | None = Field(
        default=None, description="the maintenance window it is in; null when in none"
    )


class NodesPublic(BaseModel):
    data: list[NodePublic]
    count: int


class LatestSample(BaseModel):
    ts: datetime
    values: dict[str, Any] = Field(
        description="Canonical fields the GPU reported; absent = not reported"
    )


class GpuSummary(BaseModel):
    uuid: str
    index: int
    serial: str | None
    pci_bus_id: str | None
    name: str | None
    driver_version: str | None
    vbios_version: str | None
    node: str
    first_seen: datetime
    last_seen: datetime
    latest: LatestSample | None
    mig: MigIdentity | None = Field(
        default=None,
        description="MIG mode and GPU instances declared with the newest sample; absent for a "
        "GPU without MIG enabled",
    )


class NodeDetail(NodePublic):
    boot_id: str | None
    gpus: list[GpuSummary]


class EventPublic(BaseModel):
    id: int
    node: str | None = Field(description="null for fleet-wide events, such as a wear-out onset")
    kind: str
    ts: datetime
    received_at: datetime
    gpu_uuid: str | None
    pci_bus_id: str | None
    xid: int | None
    message: str | None
    pid: int | None
    process: str | None
    details: dict[str, Any] | None


class EventsPublic(BaseModel):
    data: list[EventPublic]
    count: int


class GpuDetail(GpuSummary):
    recent_events: list[EventPublic]


class SamplePoint(BaseModel):
    ts: datetime
    boot_id: str | None
    values: dict[str, Any]


class SamplesPublic(BaseModel):
    uuid: str
    fields: list[str]
    data: list[SamplePoint]
    count: int
    rates: dict[str, list[dict[str, Any]]] | None = Field(
        default=None,
        description="Per-second rates of counter fields between consecutive samples; a counter "
        "reset (value drop or new boot_id) starts a new segment instead of a negative rate",
    )
