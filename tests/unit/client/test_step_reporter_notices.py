"""StepReporter's notices (issue 15): read from a background thread by cursor, delivered to
``on_notice``, answered by ``should_checkpoint()`` once, and never blocking or raising into the
training loop, with the server away or the callback failing."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from fleetwatch.client import StepReporter

URL = "http://fleetwatch.invalid"


def _notice(id_: int, kind: str, action: str, **kw: Any) -> dict[str, Any]:
    return {"id": id_, "job_id": "job-9", "kind": kind, "node": "gpu-3", "gpu": None,
            "reason": kind, "evidence": {}, "action": action, "opened_at": "2026-12-01T00:00:00Z",
            "cleared_at": None, "clears": None, **kw}  # fmt: skip


class Server:
    """Serves the job's notices by cursor; a long-poll with nothing new waits for ``release``."""

    def __init__(self, notices: list[dict[str, Any]], *, fail_first: int = 0) -> None:
        self.notices = notices
        self.fail_first = fail_first
        self.afters: list[int] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def publish(self, notice: dict[str, Any]) -> None:
        with self.lock:
            self.notices.append(notice)
        self.release.set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs/job-9/notices"
        if self.fail_first > 0:
            self.fail_first -= 1
            raise httpx.ConnectError("connection refused", request=request)
        after = int(request.url.params["after"])
        self.afters.append(after)
        with self.lock:
            new = [n for n in self.notices if n["id"] > after]
        if not new:
            self.release.wait(0.2)  # a long-poll, shortened
            self.release.clear()
        cursor = new[-1]["id"] if new else after
        return httpx.Response(200, json={"job_id": "job-9", "count": len(new), "data": new,
                                         "cursor": cursor, "open": 0})  # fmt: skip


def _reporter(server: Any, **kw: Any) -> StepReporter:
    return StepReporter(URL, "fwt_x", "job-9", rank=0, node="gpu-3", flush_interval_s=0.05,
                        transport=httpx.MockTransport(server), **kw)  # fmt: skip


def _wait_for(condition: Any) -> None:
    done = threading.Event()
    for _ in range(600):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError("condition not met within 30 s")


def test_notices_arrive_in_order_and_ask_for_one_checkpoint() -> None:
    server = Server([_notice(1, "drain_pending", "checkpoint_and_exit")])
    heard: list[dict[str, Any]] = []
    reporter = _reporter(server, on_notice=heard.append)
    try:
        _wait_for(lambda: len(heard) == 1)
        assert reporter.should_checkpoint() is True
        assert reporter.should_checkpoint() is False  # once per notice, not every step
        assert reporter.exit_advised and [n["id"] for n in reporter.open_notices] == [1]
        server.publish(_notice(2, "cleared", "continue", clears=1, cleared_at="x"))
        _wait_for(lambda: len(heard) == 2)
        assert reporter.open_notices == [] and not reporter.exit_advised
        assert reporter.should_checkpoint() is False  # a clearing asks for nothing
        server.publish(_notice(3, "risk", "checkpoint_now"))
        _wait_for(lambda: len(heard) == 3)
        with reporter.checkpoint(step=10):
            pass
        assert reporter.should_checkpoint() is False  # the checkpoint answered it
        assert [n["id"] for n in reporter.notices] == [1, 2, 3]
        assert reporter.notice_cursor == 3
        assert server.afters[0] == 0 and 1 in server.afters and 2 in server.afters
    finally:
        reporter.close(timeout_s=10)


def test_after_the_server_was_away_the_missed_notices_arrive() -> None:
    server = Server([_notice(5, "gpu_out", "checkpoint_and_exit")], fail_first=3)
    reporter = _reporter(server)
    try:
        for step in range(1000):  # the loop runs on while the server is away
            reporter.step(step, 1.0)
            reporter.should_checkpoint()
        _wait_for(lambda: reporter.notices)
        assert reporter.should_checkpoint() is True
        assert server.afters[0] == 0  # nothing read before the outage: from the start
    finally:
        reporter.close(timeout_s=10)


def test_server_down_never_blocks_or_raises_into_the_loop() -> None:
    def away(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    reporter = _reporter(away)
    for step in range(10_000):
        reporter.step(step, 1.0)
        assert reporter.should_checkpoint() is False
    assert reporter.notices == [] and not reporter.exit_advised
    reporter.close(timeout_s=1)


def test_a_failing_callback_is_logged_and_later_notices_still_arrive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server([_notice(1, "risk", "checkpoint_now"), _notice(2, "risk", "checkpoint_now")])

    def broken(notice: dict[str, Any]) -> None:
        raise RuntimeError("callback bug")

    reporter = _reporter(server, on_notice=broken)
    try:
        _wait_for(lambda: len(reporter.notices) == 2)
        assert reporter.should_checkpoint() is True
        assert "on_notice raised" in caplog.text
    finally:
        reporter.close(timeout_s=10)


def test_notices_off_reads_nothing() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={})

    reporter = _reporter(handler, notices=False)
    reporter.start(ranks=1)
    reporter.close(timeout_s=10)
    assert asked == ["/v1/jobs/job-9/start"]
