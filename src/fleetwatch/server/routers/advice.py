"""Advice for training jobs: how often to checkpoint, from the fleet's current failure hazard."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.models.checkpoint import GpuHazard, advise
from fleetwatch.server.deps import DatabaseDep, ReadAuth
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.repo.jobs import get_job
from fleetwatch.server.repo.notices import open_job_notices
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.notices import NoticePublic

__all__ = ["router"]

router = APIRouter(tags=["advice"])


class NodeContribution(BaseModel):
    node: str
    gpus: int
    rate_per_day: float = Field(description="Sum of the node's GPU hazards, failures per day")
    share: float = Field(description="Fraction of the job's failure rate")
    out_of_service_gpus: list[str] = Field(
        description="GPUs a rule takes out; each counted as p = 0.99 a day (move off the node)"
    )
    gpus_without_rate: int = Field(description="GPUs with no probability (counted as 0)")


class CheckpointAdvicePublic(BaseModel):
    job_id: str | None
    nodes: list[str]
    assessed_at: str
    model_version: int | None
    checkpoint_cost_s: float
    restart_cost_s: float
    failure_rate_per_day: float
    mtbf_s: float | None = Field(description="1 / failure rate; null when the rate is 0")
    interval_s: float | None = Field(description="Daly's optimum; null when the rate is 0")
    young_interval_s: float | None
    method: str = Field(description="daly: sqrt(2 delta M) - delta; daly_large_cost: M")
    goodput: float = Field(description="Expected fraction of time on kept work at interval_s")
    contributions: list[NodeContribution]
    open_notices: list[int] = Field(
        default_factory=list,
        description="Ids of the job's open notices that raised the hazard (GET "
        "/v1/jobs/{id}/notices): a drain pending or a GPU out counts the node's GPUs as out "
        "(p = 0.99 a day), a risk notice spreads the node's P(failure within the horizon) as "
        "a daily rate over its GPUs",
    )


def elevate(
    hazards: list[GpuHazard], notices: list[NoticePublic]
) -> tuple[list[GpuHazard], list[int]]:
    """The hazards with the job's open notices applied, and the ids of those that applied."""
    out_nodes = {n.node for n in notices if n.kind in ("drain_pending", "gpu_out")}
    risk = {n.node: n for n in notices if n.kind == "risk" and n.node not in out_nodes}
    per_node: dict[str, int] = {}
    for h in hazards:
        per_node[h.node] = per_node.get(h.node, 0) + 1
    raised = {n.id for n in notices if n.node in out_nodes or n.node in risk}
    elevated = []
    for h in hazards:
        if h.node in out_nodes:
            elevated.append(GpuHazard(h.node, h.uuid, h.probability, out_of_service=True))
        elif h.node in risk:
            evidence = risk[h.node].evidence or {}
            p, horizon_h = evidence.get("probability"), evidence.get("horizon_h")
            if p is None or not horizon_h or p >= 1:
                elevated.append(h)
                continue
            # The node's rate over the notice's horizon, per day, shared by its GPUs.
            rate = -math.log1p(-float(p)) * 24.0 / float(horizon_h) / per_node[h.node]
            day = 1.0 - math.exp(-rate)
            elevated.append(GpuHazard(h.node, h.uuid, max(h.probability or 0.0, day)))
        else:
            elevated.append(h)
    return elevated, sorted(raised)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


@router.get(
    "/advice/checkpoint",
    response_model=CheckpointAdvicePublic,
    responses=error_responses(described={404: "No such job"}),
    summary="Optimal checkpoint interval for a job or a set of nodes",
)
def get_checkpoint_advice(
    request: Request,
    db: DatabaseDep,
    _token: ReadAuth,
    checkpoint_cost_s: Annotated[float, Query(gt=0, le=1e7, description="Seconds per checkpoint")],
    job: Annotated[Text | None, Query(description="a job that reported steps")] = None,
    nodes: Annotated[Text | None, Query(description="comma-separated node names")] = None,
    restart_cost_s: Annotated[float, Query(ge=0, le=1e7, description="Seconds to restart")] = 0.0,
) -> CheckpointAdvicePublic:
    """Young/Daly interval from the summed one-day hazard of the nodes' GPUs (see
    ``fleetwatch.models.checkpoint`` for the formulas)."""
    if (job is None) == (nodes is None):
        raise InvalidInput(
            "give exactly one of job= or nodes=",
            [{"loc": ["query", "job"], "msg": "job or nodes, not both"}],
        )
    if job is not None:
        with db.read() as conn:
            found = get_job(conn, job)
        if found is None:
            raise NotFound("job", job)
        names = found.nodes
    else:
        names = sorted({n.strip() for n in (nodes or "").split(",") if n.strip()})
        if not names:
            raise InvalidInput(
                "nodes: no node names", [{"loc": ["query", "nodes"], "msg": "empty"}]
            )
    assessor: Assessor = request.app.state.assessor
    snap = assessor.current()
    wanted = set(names)
    hazards = [
        GpuHazard(r.gpu.node, r.gpu.uuid, r.probability, r.basis == "rule")
        for r in snap.risks(1.0)
        if r.gpu.node in wanted
    ]
    if not hazards:
        raise InvalidInput(
            f"no assessed GPUs on nodes {names}",
            [{"loc": ["query", "job" if job else "nodes"], "msg": "no GPUs"}],
        )
    raised: list[int] = []
    if job is not None:
        with db.read() as conn:
            notices = [
                NoticePublic.model_validate(row, from_attributes=True)
                for row in open_job_notices(conn, job)
            ]
        hazards, raised = elevate(hazards, notices)
    advice = advise(hazards, checkpoint_cost_s=checkpoint_cost_s, restart_cost_s=restart_cost_s)
    if advice is None:
        raise InvalidInput(
            "no failure rate for these GPUs: no risk model is fitted yet (POST /v1/models/refit "
            "once the fleet has failures on record) and no rule verdict takes any of them out",
            [{"loc": ["query", "job" if job else "nodes"], "msg": "no model and no rule verdict"}],
        )
    total = advice.rate_per_day
    return CheckpointAdvicePublic(
        job_id=job,
        nodes=names,
        open_notices=raised,
        assessed_at=snap.at.isoformat(),
        model_version=snap.model_version,
        checkpoint_cost_s=checkpoint_cost_s,
        restart_cost_s=restart_cost_s,
        failure_rate_per_day=total,
        mtbf_s=_finite(advice.mtbf_s),
        interval_s=_finite(advice.interval_s),
        young_interval_s=_finite(advice.young_interval_s),
        method=advice.method,
        goodput=advice.goodput,
        contributions=[
            NodeContribution(
                node=n.node,
                gpus=n.gpus,
                rate_per_day=n.rate_per_day,
                share=n.rate_per_day / total if total > 0 else 0.0,
                out_of_service_gpus=n.out_of_service_gpus,
                gpus_without_rate=n.gpus_without_rate,
            )
            for n in advice.nodes
        ],
    )
