"""StepReporter's job reports (start, end, checkpoint, restarted): sent from its thread, never
blocking or raising into the training loop, whatever the server does."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from fleetwatch.client import StepReporter

URL = "http://fleetwatch.invalid"


def _reporter(handler: Any, **kw: Any) -> StepReporter:
    # Notices off: these tests count the reports the handler sees (test_step_reporter_notices.py)
    return StepReporter(URL, "fwt_x", "job-9", rank=0, node="gpu-3", flush_interval_s=0.05,
                        transport=httpx.MockTransport(handler), notices=False, **kw)  # fmt: skip


def test_job_reports_reach_their_endpoints_in_order() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def ok(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={})

    stopped = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    reporter = _reporter(ok)
    reporter.start(ranks=8)
    with reporter.checkpoint(step=100):
        pass
    reporter.restarted(from_step=100, lost_steps=7, interrupted_at=stopped)
    reporter.end("failed", reason="NCCL timeout")
    reporter.close(timeout_s=60)
    assert [p for p, _ in seen] == [
        "/v1/jobs/job-9/start",
        "/v1/jobs/job-9/checkpoints",
        "/v1/jobs/job-9/restarts",
        "/v1/jobs/job-9/end",
    ]
    start, ckpt, restart, end = (b for _, b in seen)
    assert start["nodes"] == ["gpu-3"] and start["ranks"] == 8
    assert datetime.fromisoformat(start["started_at"]).tzinfo is not None
    assert ckpt["step"] == 100 and ckpt["duration_s"] >= 0
    assert restart["interrupted_at"] == stopped.isoformat() and restart["lost_steps"] == 7
    assert end == {"outcome": "failed", "ended_at": end["ended_at"], "reason": "NCCL timeout"}
    assert (reporter.sent_events, reporter.rejected_events, reporter.dropped_events) == (4, 0, 0)


def test_job_reports_with_the_server_away_queue_bounded_and_never_raise() -> None:
    def away(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    reporter = _reporter(away, max_events=5)
    calls = threading.Thread(
        target=lambda: [
            reporter.start(),
            *(reporter.restarted(from_step=n, lost_steps=1) for n in range(20)),
            reporter.end("completed"),
        ]
    )
    calls.start()
    calls.join(60)
    assert not calls.is_alive(), "a job report waited on the network"
    # At most 5 queued, one maybe in a send; the oldest are dropped.
    assert reporter.pending_events <= 5
    assert reporter.dropped_events >= 22 - 5 - 1
    closer = threading.Thread(target=reporter.close, kwargs={"timeout_s": 0.2})
    closer.start()
    closer.join(60)
    assert not closer.is_alive()
    assert reporter.sent_events == 0


def test_job_report_refused_is_counted_not_retried() -> None:
    posts: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        posts.append(request.url.path)
        return httpx.Response(422, json={"detail": [{"loc": ["body", "ended_at"]}]})

    reporter = _reporter(refuse)
    reporter.end("cancelled", ended_at=datetime.now(UTC) + timedelta(days=3))
    reporter.close(timeout_s=60)
    assert posts == ["/v1/jobs/job-9/end"]
    assert (reporter.rejected_events, reporter.sent_events) == (1, 0)


def test_job_report_bad_arguments_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    bodies: list[dict[str, Any]] = []

    def ok(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(422)

    reporter = _reporter(ok)
    reporter.end("exploded")  # not an outcome: not sent at all
    reporter.start(nodes="gpu-1", started_at="yesterday")  # type: ignore[arg-type]
    reporter.restarted(lost_s=object())  # type: ignore[arg-type]  # not JSON: dropped in thread
    reporter.close(timeout_s=60)
    assert "not one of" in caplog.text
    assert bodies == [{"started_at": "yesterday", "nodes": ["gpu-3"]}]
    assert reporter.rejected_events == 1 and reporter.dropped_events == 1


def test_checkpoint_that_raises_is_not_reported_and_the_error_goes_on() -> None:
    paths: list[str] = []

    def ok(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200)

    reporter = _reporter(ok)
    with pytest.raises(OSError, match="disk full"), reporter.checkpoint(step=5):
        raise OSError("disk full")
    reporter.close(timeout_s=60)
    assert paths == []
