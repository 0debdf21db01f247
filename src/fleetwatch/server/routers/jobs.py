"""Training jobs: step reports (agent scope), jobs and their straggler verdicts (read scope).

Training processes report with an **agent** token (``fleetwatch token create --scope agent``),
the same scope as node agents: reporting steps is telemetry, not reading the fleet. A batch is
validated whole before anything is stored: one bad step refuses the batch (422 naming
``body.steps.<i>.<field>``), and nothing of it is kept.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.models.stragglers import judge_window
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import DatabaseDep, IngestAuth, ReadAuth, SettingsDep
from fleetwatch.server.repo.jobs import get_job, list_jobs, list_stragglers, read_steps, store_steps
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.jobs import (
    JobDetailPublic,
    JobPublic,
    JobsPublic,
    NodeStepStats,
    StepsAccepted,
    StepsBatch,
    StragglerPublic,
    StragglersPublic,
)

__all__ = ["router"]

router = APIRouter(tags=["jobs"])

JobId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
]


def _validate(body: StepsBatch, settings: ServerSettings) -> list[dict[str, object]]:
    limit = settings.max_steps_per_batch
    if len(body.steps) > limit:
        raise InvalidInput(
            f"steps: {len(body.steps)} in one batch, at most {limit}; send smaller batches",
            [{"loc": ["body", "steps"], "msg": f"more than {limit} steps"}],
        )
    latest = utcnow() + timedelta(seconds=settings.max_future_skew_s)
    problems = []
    for i, step in enumerate(body.steps):  # each ts has an offset and a year (AwareInstant)
        if step.ts > latest:
            problems.append({"loc": ["body", "steps", i, "ts"], "msg": "in the future"})
    if problems:
        where = ", ".join(".".join(str(p) for p in d["loc"]) for d in problems[:5])
        raise InvalidInput(f"invalid step timestamps: {where}; nothing stored", problems)
    return [step.model_dump() for step in body.steps]


def _store(db: Database, job_id: str, rows: list[dict[str, object]]) -> StepsAccepted:
    with db.write() as conn:
        job = store_steps(conn, job_id, rows)
    return StepsAccepted(accepted=len(rows), job_id=job_id, ranks=job.ranks, nodes=len(job.nodes))


@router.post(
    "/jobs/{job_id}/steps",
    response_model=StepsAccepted,
    summary="Report step times of a training job (agent token)",
)
async def post_steps(
    job_id: JobId, body: StepsBatch, db: DatabaseDep, settings: SettingsDep, _token: IngestAuth
) -> StepsAccepted:
    """Store a batch of rank-step durations, all or nothing; creates or widens the job."""
    rows = _validate(body, settings)
    return await run_in_threadpool(_store, db, job_id, rows)


@router.get("/jobs", response_model=JobsPublic, summary="Recent training jobs")
def get_jobs(
    db: DatabaseDep, _token: ReadAuth, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> JobsPublic:
    """Jobs by their newest step, newest first."""
    with db.read() as conn:
        found = list_jobs(conn, limit=limit)
    return JobsPublic(data=[JobPublic(**vars(j)) for j in found], count=len(found))


@router.get(
    "/jobs/{job_id}",
    response_model=JobDetailPublic,
    responses=error_responses(404),
    summary="One job: per-node step times over its last window, open verdicts",
)
def get_job_detail(
    job_id: JobId, db: DatabaseDep, settings: SettingsDep, _token: ReadAuth
) -> JobDetailPublic:
    """p50, p99 and p99/p50 per node over the job's newest ``straggler_window_s`` of steps."""
    width = timedelta(seconds=settings.straggler_window_s)
    with db.read() as conn:
        job = get_job(conn, job_id)
        if job is None:
            raise NotFound("job", job_id)
        end = job.last_seen + timedelta(microseconds=1)
        steps = read_steps(conn, job_id, end - width, end)
        open_rows = list_stragglers(conn, job_id=job_id, active=True)
    result = judge_window(steps, end - width, end, ratio=settings.straggler_ratio)
    stats: list[NodeStepStats] = []
    if result is not None:
        slowest_first = sorted(result.nodes.values(), key=lambda n: -n.ratio)
        stats = [
            NodeStepStats(
                node=n.node,
                steps=n.steps,
                p50_ms=n.p50_ms,
                p99_ms=n.p99_ms,
                p99_over_p50=n.p99_over_p50,
                ratio=n.ratio,
            )
            for n in slowest_first
        ]
    return JobDetailPublic(
        **vars(job),
        window_start=end - width if steps else None,
        window_s=settings.straggler_window_s,
        job_median_ms=result.job_median_ms if result else None,
        node_stats=stats,
        stragglers=[StragglerPublic(**r) for r in open_rows],
    )


@router.get("/stragglers", response_model=StragglersPublic, summary="Straggler verdicts")
def get_stragglers(
    db: DatabaseDep,
    _token: ReadAuth,
    active: Annotated[bool | None, Query(description="true: open only; false: closed")] = None,
    kind: Annotated[Literal["hardware", "workload"] | None, Query()] = None,
    job: Annotated[Text | None, Query(description="only this job")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> StragglersPublic:
    """Newest first."""
    with db.read() as conn:
        rows = list_stragglers(conn, job_id=job, active=active, kind=kind, limit=limit)
    return StragglersPublic(data=[StragglerPublic(**r) for r in rows], count=len(rows))
