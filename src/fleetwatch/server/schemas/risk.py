"""Risk API documents: ranked GPUs and nodes with their probability, evidence and verdicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["FactorPublic", "GpuRiskPublic", "NodeRiskPublic", "RiskPage", "VerdictPublic"]


class VerdictPublic(BaseModel):
    kind: Literal["xid", "health", "host"] = Field(
        description="an Xid rule, a telemetry rule, or a host rule: a kernel-log host error "
        "(NVSwitch SXid, PCIe AER, machine check, EDAC) or a network port rule (port_down, "
        "port_flap, port_degraded, port_errors); evidence.scope says whether it is about the GPU "
        "or its node, evidence.component which part (gpu, memory, nvlink, network, host)"
    )
    rule: str
    severity: str
    action: str = Field(
        description=(
            "none, restart_app, investigate, reset_gpu, drain_reset, drain_inspect, reboot_node"
        )
    )
    counts_against_gpu: bool
    takes_gpu_out: bool = Field(
        description="critical or fatal, and counted against the GPU or a host verdict (the "
        "node's fabric, CPU, memory or a network port failed)"
    )
    source: str = Field(description="the catalogue row or threshold default behind the verdict")
    xids: list[int]
    first_seen: datetime | None
    last_seen: datetime | None
    evidence: dict[str, Any]
    note: str


class FactorPublic(BaseModel):
    name: str
    value: float | None = Field(
        description="null: not reported (the AFT used the training median; a landmark model "
        "takes it as missing)"
    )
    hazard_ratio: float | None = Field(
        description="AFT: > 1 raises the risk against the training average; null for the "
        "landmark model"
    )
    contribution: float | None = Field(
        default=None,
        description="landmark model: this covariate's path contribution to the log-odds of "
        "failure within the horizon; > 0 raises the risk; null for the AFT",
    )


class GpuRiskPublic(BaseModel):
    uuid: str
    node: str
    index: int
    serial: str | None
    sku: str | None
    age_days: float
    probability: float | None = Field(
        description="P(failure within the horizon); 1 when a rule takes the GPU out of service; "
        "null when no model is fitted yet"
    )
    model_probability: float | None = Field(description="the model's own probability")
    basis: Literal["rule", "model", "none"]
    model_version: int | None
    model: str | None = Field(description="landmark, aft, weibull:<group> or weibull:fleet")
    factors: list[FactorPublic]
    covariates: dict[str, float] = Field(description="telemetry covariates over the window")
    verdicts: list[VerdictPublic]


class NodeRiskPublic(BaseModel):
    node: str
    probability: float | None = Field(description="1 − Π(1 − p) over the node's GPUs")
    gpus: list[GpuRiskPublic] = Field(description="the node's GPUs, riskiest first")


class RiskPage(BaseModel):
    assessed_at: datetime = Field(description="when the fleet was last judged (background)")
    horizon_hours: float
    scope: Literal["gpu", "node"]
    model_version: int | None
    total: int = Field(description="units ranked, before the limit")
    gpus: list[GpuRiskPublic] | None = None
    nodes: list[NodeRiskPublic] | None = None
