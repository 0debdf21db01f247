"""A node's network adapter ports as the read API returns them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CounterRate", "NodePortsPublic", "PortPublic", "PortRates"]


class CounterRate(BaseModel):
    per_s: float = Field(description="Increase per second since the reading before")
    increase: int = Field(description="Increase since the reading before")
    reset: bool = Field(
        description="The counter restarted in between (it dropped, or the node rebooted): "
        "the increase counts from zero"
    )


class PortRates(BaseModel):
    counters: dict[str, CounterRate] = Field(default_factory=dict)
    hw_counters: dict[str, CounterRate] = Field(default_factory=dict)


class PortPublic(BaseModel):
    """The newest reading of one port (see the wire's ``PortSample`` for each field)."""

    model_config = ConfigDict(from_attributes=True)

    device: str
    port: int
    ts: datetime = Field(description="When the newest reading was taken")
    boot_id: str | None = Field(description="The node's boot id at that reading")
    link_layer: str | None
    node_guid: str | None
    netdev: str | None
    state: str | None
    state_code: int | None
    phys_state: str | None
    phys_state_code: int | None
    rate_gbps: float | None
    link_width: int | None
    link_speed: str | None
    counters: dict[str, int] | None = Field(description="As read; absent counters left out")
    hw_counters: dict[str, int] | None
    rates: PortRates | None = Field(
        description="Per-second rates of the counters between the reading before and this one; "
        "null for a port's first reading"
    )
    rates_since: datetime | None = Field(description="When the reading before was taken")
    normal_rate_gbps: float | None = Field(
        default=None,
        description="The highest rate the port has shown while up: the port rules call it "
        "degraded below this",
    )
    normal_width: int | None = Field(
        default=None, description="The most lanes the port has shown while up"
    )
    degraded: bool | None = Field(
        default=None, description="Up below its normal rate or width at the newest reading"
    )


class NodePortsPublic(BaseModel):
    node: str
    data: list[PortPublic]
    count: int
