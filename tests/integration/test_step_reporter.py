"""StepReporter against a real `fleetwatch server` process, and with no server at all."""

from __future__ import annotations

import time
from pathlib import Path

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


def test_step_reporter_waits_out_a_server_that_comes_late(sqlite_url: str, tmp_path: Path) -> None:
    agent, reader = create_token(sqlite_url, "agent"), create_token(sqlite_url, "read")
    port = free_port()
    reporter = StepReporter(f"http://127.0.0.1:{port}", agent, "late-job", rank=0, node="n1",
                            flush_interval_s=0.2, close_timeout_s=30.0)  # fmt: skip
    for step in range(50):
        reporter.step(step, 100.0)
    time.sleep(0.5)  # a few failed sends
    with live_server(sqlite_url, tmp_path, port=port) as server:
        reporter.close()
        assert reporter.sent == 50 and reporter.pending == 0
        with server.client(reader) as read:
            assert _steps_stored(read, "late-job") == 50


def test_step_reporter_never_slows_the_loop_when_the_server_is_away() -> None:
    reporter = StepReporter(f"http://127.0.0.1:{free_port()}", "fwt_x", "gone", rank=0,
                            node="n1", flush_interval_s=0.05, max_queue=100)  # fmt: skip
    slowest = 0.0
    for step in range(2000):
        started = time.perf_counter()
        reporter.step(step, 50.0)
        slowest = max(slowest, time.perf_counter() - started)
        if step % 200 == 0:
            time.sleep(0.02)  # let the sender fail a few times meanwhile
    assert slowest < 0.005
    assert reporter.pending <= 100
    assert reporter.dropped >= 1900  # the oldest go first; the newest 100 are kept
    started = time.perf_counter()
    reporter.close(timeout_s=1.0)
    assert time.perf_counter() - started < 3.0
    assert reporter.sent == 0
