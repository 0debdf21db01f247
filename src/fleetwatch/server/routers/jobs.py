"""Training jobs: step reports, start, end, checkpoints and restarts (agent scope); jobs, their
outcome and straggler verdicts (read scope).

Training processes report with an **agent** token (``fleetwatch token create --scope agent``),
the same scope as node agents: reporting steps is telemetry, not reading the fleet. Steps, a
start and an end name nodes, and a caller may name only those it speaks for
(:mod:`fleetwatch.server.node_binding`); checkpoints and restarts name none. A batch is
validated whole before anything is stored: one bad step refuses the batch (422 naming
``body.steps.<i>.<field>``), and nothing of it is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput, NotFound
from fleetwatch.models.stragglers import judge_window
from fleetwatch.reports.job_failures import attribute_failure, failures_by_node
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import DatabaseDep, IngestAuth, ReadAuth, SettingsDep
from fleetwatch.server.node_binding import check_speaks_for
from fleetwatch.server.repo.job_outcomes import (
    checkpoint_summary,
    end_job,
    node_failures,
    restart_summary,
    start_job,
    store_checkpoint,
    store_restart,
)
from fleetwatch.server.repo.jobs import get_job, list_jobs, list_stragglers, read_steps, store_steps
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.jobs import (
    CheckpointReport,
    CheckpointSummary,
    HardwareFailure,
    JobDetailPublic,
    JobEnd,
    JobEventAccepted,
    JobPublic,
    JobsPublic,
    JobStart,
    NodeStepStats,
    RestartReport,
    RestartSummary,
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
    job_id: JobId,
    body: StepsBatch,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    token: IngestAuth,
) -> StepsAccepted:
    """Store a batch of rank-step durations, all or nothing; creates or widens the job. 403 when
    the caller may not speak for a step's node."""
    check_speaks_for(request.scope, token, sorted({step.node for step in body.steps}))
    rows = _validate(body, settings)
    return await run_in_threadpool(_store, db, job_id, rows)


def _not_future(settings: ServerSettings, **instants: datetime | None) -> None:
    """422 naming each instant (``body.<name>``) later than the server's clock allows."""
    latest = utcnow() + timedelta(seconds=settings.max_future_skew_s)
    late = [name for name, ts in instants.items() if ts is not None and ts > latest]
    if late:
        problems = [{"loc": ["body", name], "msg": "in the future"} for name in late]
        raise InvalidInput(f"{', '.join(late)}: in the future; nothing stored", problems)


def _write(db: Database, work: Callable[[Connection], bool]) -> bool:
    with db.write() as conn:
        return work(conn)


@router.post(
    "/jobs/{job_id}/start",
    response_model=JobEventAccepted,
    summary="Report a training job's start and its nodes (agent token)",
)
async def post_start(
    job_id: JobId,
    body: JobStart,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    token: IngestAuth,
) -> JobEventAccepted:
    """Idempotent: a repeat keeps the earliest start and adds any new nodes. 403 when the caller
    may not speak for one of the nodes."""
    check_speaks_for(request.scope, token, body.nodes)
    _not_future(settings, started_at=body.started_at)

    def work(conn: Connection) -> bool:
        start_job(
            conn,
            job_id,
            body.started_at,
            body.nodes,
            body.ranks,
            notice_risk_threshold=body.notice_risk_threshold,
            notice_horizon_h=body.horizon_h,
        )
        return True

    return JobEventAccepted(job_id=job_id, stored=await run_in_threadpool(_write, db, work))


@router.post(
    "/jobs/{job_id}/end",
    response_model=JobEventAccepted,
    summary="Report how a training job ended: completed, failed or cancelled (agent token)",
)
async def post_end(
    job_id: JobId,
    body: JobEnd,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    token: IngestAuth,
) -> JobEventAccepted:
    """The newest end replaces an earlier one (a requeued job ends again). 422 when
    ``ended_at`` is before the job's reported start; 403 when the caller may not speak for one
    of the nodes it names."""
    check_speaks_for(request.scope, token, body.nodes or ())
    _not_future(settings, ended_at=body.ended_at)

    def work(conn: Connection) -> bool:
        job = get_job(conn, job_id)
        if job is not None and job.started_at is not None and body.ended_at < job.started_at:
            problem = {"loc": ["body", "ended_at"], "msg": "before the job's start"}
            raise InvalidInput(
                f"ended_at: before the job's start ({job.started_at.isoformat()}); nothing stored",
                [problem],
            )
        end_job(conn, job_id, body.ended_at, body.outcome, body.reason, body.nodes or ())
        return True

    return JobEventAccepted(job_id=job_id, stored=await run_in_threadpool(_write, db, work))


@router.post(
    "/jobs/{job_id}/checkpoints",
    response_model=JobEventAccepted,
    summary="Report a checkpoint the job wrote and how long it took (agent token)",
)
async def post_checkpoint(
    job_id: JobId,
    body: CheckpointReport,
    db: DatabaseDep,
    settings: SettingsDep,
    _token: IngestAuth,
) -> JobEventAccepted:
    """Keyed by ``started_at``: a repeat answers ``stored: false``."""
    _not_future(settings, started_at=body.started_at)
    values = body.model_dump()
    stored = await run_in_threadpool(_write, db, lambda c: store_checkpoint(c, job_id, values))
    return JobEventAccepted(job_id=job_id, stored=stored)


@router.post(
    "/jobs/{job_id}/restarts",
    response_model=JobEventAccepted,
    summary="Report a restart from a checkpoint and the work it redid (agent token)",
)
async def post_restart(
    job_id: JobId,
    body: RestartReport,
    db: DatabaseDep,
    settings: SettingsDep,
    _token: IngestAuth,
) -> JobEventAccepted:
    """Keyed by ``resumed_at``: a repeat answers ``stored: false``."""
    _not_future(settings, resumed_at=body.resumed_at)
    if body.interrupted_at is not None and body.interrupted_at > body.resumed_at:
        raise InvalidInput(
            "interrupted_at: after resumed_at; nothing stored",
            [{"loc": ["body", "interrupted_at"], "msg": "after resumed_at"}],
        )
    values = body.model_dump()
    stored = await run_in_threadpool(_write, db, lambda c: store_restart(c, job_id, values))
    return JobEventAccepted(job_id=job_id, stored=stored)


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
        checkpoints = checkpoint_summary(conn, job_id)
        restarts = restart_summary(conn, job_id)
        failure = None
        if job.outcome == "failed" and job.ended_at is not None:
            before = timedelta(seconds=settings.job_failure_before_s)
            after = timedelta(seconds=settings.job_failure_after_s)
            found = node_failures(conn, job.ended_at - before, job.ended_at + after, job.nodes)
            failure = attribute_failure(
                job.nodes, job.ended_at, failures_by_node(found), before=before, after=after
            )
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
        hardware_failure=HardwareFailure(**vars(failure)) if failure else None,
        checkpoints=CheckpointSummary(**checkpoints),
        restarts=RestartSummary(**restarts),
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
