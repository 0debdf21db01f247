"""The pusher: what each server answer does to a spooled batch (httpx.MockTransport server)."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

from fleetwatch.agent.push import Backoff, Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool


def _pusher(tmp_path: Path, answers: list[int]) -> tuple[Pusher, Spool, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = answers.pop(0) if answers else 200
        if status == 0:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(status, json={"error": f"status {status}"})

    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://server")
    spool = Spool(tmp_path / "spool")
    pusher = Pusher(
        client, spool, AgentMetrics(), rejected_dir=tmp_path / "rejected", rng=random.Random(1)
    )
    return pusher, spool, seen


def test_pusher_sends_gzip_in_order_and_removes_acknowledged(tmp_path: Path) -> None:
    pusher, spool, seen = _pusher(tmp_path, [200, 200])
    spool.put("a", b"gz-a", samples=1, events=0)
    spool.put("b", b"gz-b", samples=1, events=0)
    assert pusher.drain() == 5.0
    assert [r.content for r in seen] == [b"gz-a", b"gz-b"]
    assert seen[0].headers["content-encoding"] == "gzip"
    assert seen[0].url.path == "/v1/ingest"
    assert spool.depth() == (0, 0)


@pytest.mark.parametrize("failure", [0, 500, 503, 429, 408, 401, 403])
def test_pusher_keeps_batch_on_retryable_failure(tmp_path: Path, failure: int) -> None:
    pusher, spool, seen = _pusher(tmp_path, [failure])
    spool.put("a", b"gz-a", samples=1, events=0)
    delay = pusher.drain()
    assert 0 <= delay <= 30
    assert spool.depth()[0] == 1
    assert pusher.drain() == 5.0  # the next answer is 200
    assert [r.content for r in seen] == [b"gz-a", b"gz-a"]
    assert not (tmp_path / "rejected").exists()


@pytest.mark.parametrize("failure", [400, 409, 413, 415, 422])
def test_pusher_moves_refused_batch_aside_and_goes_on(tmp_path: Path, failure: int) -> None:
    pusher, spool, _ = _pusher(tmp_path, [failure, 200])
    spool.put("bad", b"gz-bad", samples=1, events=0)
    spool.put("good", b"gz-good", samples=1, events=0)
    pusher.drain()
    assert spool.depth() == (0, 0)
    assert (tmp_path / "rejected" / "bad.json.gz").read_bytes() == b"gz-bad"
    assert (tmp_path / "rejected" / "bad.error.txt").read_text().startswith(str(failure))


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap() -> None:
    backoff, rng = Backoff(base_s=0.5, cap_s=30.0), random.Random(3)
    ceilings = []
    for _ in range(10):
        delay = backoff.next_delay(rng)
        ceiling = min(30.0, 0.5 * 2**backoff.failures)
        assert 0 <= delay <= ceiling
        ceilings.append(ceiling)
    assert ceilings[:3] == [1.0, 2.0, 4.0] and ceilings[-1] == 30.0
    backoff.reset()
    assert backoff.failures == 0
