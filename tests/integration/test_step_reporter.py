"""StepReporter against a real `fleetwatch server` process, and with no server at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fleetwatch.client import StepReporter
from tests.integration.live import create_token, fleetwatch, free_port, live_server


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    fleetwatch("db", "upgrade", "--database-url", url)
    return url


def _steps_stored(client: object, job: str) -> int:
    detail = client.get(f"/v1/jobs/{job}").json()  # type: ignore[attr-defined]
    return sum(n["steps"] for n in detail["node_stats"])


def test_step_reporter_delivers_to_a_live_server(sqlite_url: str, tmp_path: Path) -> None:
    agent, reader = create_token(sqlite_url, "agent"), create_token(sqlite_url, "read")
    with live_server(sqlite_url, tmp_path) as server:
        with StepReporter(server.url, agent, "live-job", rank=3, node="gpu-07",
                          flush_interval_s=0.2, stage=1) as reporter:  # fmt: skip
            for _ in range(150):
                with reporter.timed():
                    time.sleep(0.001)
            reporter.step(150, 12.5)
        assert reporter.sent == 151 and reporter.dropped == 0 and reporter.rejected == 0
        with server.client(reader) as read:
            detail = read.get("/v1/jobs/live-job").json()
            assert detail["ranks"] == 4 and detail["nodes"] == ["gpu-07"]
            assert _steps_stored(read, "live-job") == 151
            assert detail["node_stats"][0]["p50_ms"] >= 1.0


def test_step_reporter_waits_out_a_server_that_comes_late(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, reader = create_token(sqlite_url, "agent"), create_token(sqlite_url, "read")
    port = free_port()
    reporter = StepReporter(f"http://127.0.0.1:{port}", agent, "late-job", rank=0, node="n1",
                            flush_interval_s=0.2, close_timeout_s=30.0)  # fmt: skip
    for step in range(50):
        reporter.step(step, 100.0)
    _until(lambda: "cannot send steps" in caplog.text)  # a send has failed
    with live_server(sqlite_url, tmp_path, port=port) as server:
        reporter.close()
        assert reporter.sent == 50 and reporter.pending == 0
        with server.client(reader) as read:
            assert _steps_stored(read, "late-job") == 50


def test_step_reporter_never_slows_the_loop_when_the_server_is_away() -> None:
    reporter = StepReporter(f"http://127.0.0.1:{free_port()}", "fwt_x", "gone", rank=0,
                            node="n1", flush_interval_s=0.05, max_queue=100)  # fmt: skip
    for step in range(2000):
        reporter.step(step, 50.0)
    assert reporter.pending <= 100
    # The oldest go first; the newest 100 are kept, and one batch of at most 100 may be in the
    # sender's hands (counted when its send fails): a loaded machine showed exactly 1,800.
    assert reporter.dropped >= 1800
    reporter.close(timeout_s=1.0)
    assert reporter.sent == 0


def test_step_reporter_loop_and_close_never_wait_on_a_hung_send() -> None:
    """While the sender is stuck inside a request that never answers, ``step`` keeps queueing
    (dropping the oldest) and ``close`` gives up after its timeout. Both run on another thread
    joined with a generous limit, so a blocking call fails the test instead of hanging it."""
    in_send, release = threading.Event(), threading.Event()

    def hang(request: httpx.Request) -> httpx.Response:
        in_send.set()
        release.wait(120)
        raise httpx.ConnectError("released by the test", request=request)

    reporter = StepReporter("http://fleetwatch.invalid", "fwt_x", "hung", rank=0, node="n1",
                            flush_interval_s=0.05, max_queue=100, notices=False,
                            transport=httpx.MockTransport(hang))  # fmt: skip
    # (notices off: the hung request must be the step sender's, not the notice thread's)
    try:
        reporter.step(0, 50.0)
        assert in_send.wait(60), "the sender never took the first step"
        loop = threading.Thread(target=lambda: [reporter.step(n, 50.0) for n in range(1, 2000)])
        loop.start()
        loop.join(60)
        assert not loop.is_alive(), "step() waited on the hung send"
        assert not release.is_set()  # the send is still in flight
        assert (reporter.pending, reporter.dropped) == (100, 1899)  # step 0 is in the send
        closer = threading.Thread(target=reporter.close, kwargs={"timeout_s": 0.5})
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "close() waited on the hung send past its timeout"
        assert not release.is_set()
    finally:
        release.set()
    assert reporter.sent == 0


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_step_reporter_job_reports_reach_a_live_server(sqlite_url: str, tmp_path: Path) -> None:
    agent, reader = create_token(sqlite_url, "agent"), create_token(sqlite_url, "read")
    with live_server(sqlite_url, tmp_path) as server:
        with StepReporter(server.url, agent, "told-job", rank=0, node="gpu-01",
                          flush_interval_s=0.2) as reporter:  # fmt: skip
            reporter.start(ranks=2)
            reporter.step(0, 100.0)
            with reporter.checkpoint(step=0):
                pass
            reporter.restarted(from_step=0, lost_steps=3)
            reporter.end("completed", reason="all steps done")
        assert (reporter.sent_events, reporter.rejected_events) == (4, 0)
        with server.client(reader) as read:
            detail = read.get("/v1/jobs/told-job").json()
    assert (detail["outcome"], detail["end_reason"], detail["ranks"]) == (
        "completed", "all steps done", 2
    )  # fmt: skip
    assert detail["checkpoints"]["count"] == 1 and detail["restarts"]["lost_steps"] == 3
    assert detail["started_at"] <= detail["ended_at"]
