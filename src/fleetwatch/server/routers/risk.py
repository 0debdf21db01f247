"""Failure risk: ranked GPUs or nodes, and one GPU's risk with its evidence."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.server.deps import ReadAuth
from fleetwatch.server.judge.assessment import FleetAssessment, GpuRisk, risk_order
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.risk import (
    FactorPublic,
    GpuRiskPublic,
    NodeRiskPublic,
    RiskPage,
    VerdictPublic,
)
from fleetwatch.server.timeparse import parse_duration

__all__ = ["gpu_risk_public", "router"]

router = APIRouter(tags=["risk"])

HorizonArg = Annotated[
    Text, Query(description="How far ahead: a duration like 24h or 7d (at most 365d)")
]
_MAX_HORIZON_DAYS = 365.0


def _horizon_days(value: str) -> float:
    days = parse_duration(value, name="horizon").total_seconds() / 86400.0
    if not 0 < days <= _MAX_HORIZON_DAYS:
        raise InvalidInput(
            f"horizon: must be > 0 and at most 365d, got {value!r}",
            [{"loc": ["query", "horizon"], "msg": "must be > 0 and at most 365d"}],
        )
    return days


def _snapshot(request: Request) -> FleetAssessment:
    assessor: Assessor = request.app.state.assessor
    return assessor.current()


def gpu_risk_public(risk: GpuRisk, model_version: int | None) -> GpuRiskPublic:
    gpu = risk.gpu
    return GpuRiskPublic(
        uuid=gpu.uuid,
        node=gpu.node,
        index=gpu.index,
        serial=gpu.serial,
        sku=gpu.sku,
        age_days=round(gpu.age_days, 3),
        probability=risk.probability,
        model_probability=risk.model_probability,
        basis=risk.basis,
        model_version=model_version if risk.model_probability is not None else None,
        model=risk.model,
        factors=[
            FactorPublic(
                name=f.name, value=f.value, hazard_ratio=f.hazard_ratio, contribution=f.contribution
            )
            for f in risk.factors
        ],
        covariates=gpu.features,
        verdicts=[
            VerdictPublic(
                kind=v.kind,
                rule=v.rule,
                severity=v.severity,
                action=v.action,
                counts_against_gpu=v.counts_against_gpu,
                takes_gpu_out=v.takes_gpu_out,
                source=v.source,
                xids=list(v.xids),
                first_seen=v.first_seen,
                last_seen=v.last_seen,
                evidence=dict(v.evidence),
                note=v.note,
            )
            for v in gpu.verdicts
        ],
    )


@router.get("/risk", response_model=RiskPage, summary="GPUs or nodes ranked by failure probability")
def read_risk(
    request: Request,
    _token: ReadAuth,
    horizon: HorizonArg = "24h",
    scope: Annotated[Literal["gpu", "node"], Query(description="rank GPUs or nodes")] = "gpu",
    limit: Annotated[int, Query(ge=1, le=100_000)] = 50,
    node: Annotated[Text | None, Query(description="only this node's GPUs")] = None,
) -> RiskPage:
    """Riskiest first. Rules come first: a GPU a rule takes out of service has probability 1
    (basis ``rule``); the others carry the model's P(failure within the horizon | age,
    covariates). Computed from the newest background assessment; ``assessed_at`` says when."""
    days = _horizon_days(horizon)
    snap = _snapshot(request)
    version = snap.model_version
    page = RiskPage(
        assessed_at=snap.at, horizon_hours=days * 24, scope=scope, model_version=version, total=0
    )
    if scope == "gpu":
        risks = [r for r in snap.risks(days) if node is None or r.gpu.node == node]
        risks.sort(key=risk_order)
        page.total = len(risks)
        page.gpus = [gpu_risk_public(r, version) for r in risks[:limit]]
        return page
    nodes = [
        (name, p, members)
        for name, (p, members) in snap.node_risks(days).items()
        if node is None or name == node
    ]
    nodes.sort(key=lambda item: (-(item[1] if item[1] is not None else -1.0), item[0]))
    page.total = len(nodes)
    page.nodes = [
        NodeRiskPublic(
            node=name,
            probability=p,
            gpus=[gpu_risk_public(r, version) for r in sorted(members, key=risk_order)],
        )
        for name, p, members in nodes[:limit]
    ]
    return page


@router.get(
    "/gpus/{uuid}/risk",
    response_model=GpuRiskPublic,
    responses=error_responses(404),
    summary="One GPU's failure probability, factors and verdicts",
)
def read_gpu_risk(
    uuid: Text, request: Request, _token: ReadAuth, horizon: HorizonArg = "24h"
) -> GpuRiskPublic:
    days = _horizon_days(horizon)
    snap = _snapshot(request)
    for risk in snap.risks(days):
        if risk.gpu.uuid == uuid:
            return gpu_risk_public(risk, snap.model_version)
    raise NotFound("GPU assessed in the last day", uuid)
