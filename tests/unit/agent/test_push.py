"""The pusher: what each server answer does to a spooled batch (httpx.MockTransport server)."""

from __future__ import annotations

import random
from collections.abc import Callable
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


# -- a poisoned batch ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _poison_pusher(
    tmp_path: Path, answer: Callable[[httpx.Request], int], ready: int = 200
) -> tuple[Pusher, Spool, FakeClock, AgentMetrics, list[bytes]]:
    """A server answering ``answer(request)`` to each push and ``ready`` to /readyz."""
    pushed: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(ready)
        status = answer(request)
        if status == 200:
            pushed.append(request.content)
        return httpx.Response(status, json={"error": f"status {status}"})

    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://server")
    spool = Spool(tmp_path / "spool")
    clock, metrics = FakeClock(), AgentMetrics()
    pusher = Pusher(
        client,
        spool,
        metrics,
        rejected_dir=tmp_path / "rejected",
        rng=random.Random(1),
        poison_after_s=600,
        poison_attempts=5,
        clock=clock,
    )
    return pusher, spool, clock, metrics, pushed


def _fails_for(body: bytes, status: int) -> Callable[[httpx.Request], int]:
    return lambda request: status if request.content == body else 200


def _retry(pusher: Pusher, clock: FakeClock, times: int, every_s: float) -> None:
    for _ in range(times):
        pusher.drain()
        clock.now += every_s


def test_pusher_sets_aside_a_batch_failing_with_500_while_the_server_takes_others(
    tmp_path: Path,
) -> None:
    pusher, spool, clock, metrics, pushed = _poison_pusher(tmp_path, _fails_for(b"gz-bad", 500))
    spool.put("bad", b"gz-bad", samples=3, events=1)
    spool.put("next", b"gz-next", samples=1, events=0)
    _retry(pusher, clock, times=5, every_s=100)  # 5 answers of 500 over 400 s: kept
    assert spool.depth()[0] == 2 and pushed == []
    clock.now += 100  # 600 s since the first 500
    pusher.drain()  # a 6th 500, the next batch taken, a last try: a 7th
    # The batch behind it went through, the poisoned one is set aside with the server's answer.
    assert pushed == [b"gz-next"]
    assert spool.depth() == (0, 0)
    assert (tmp_path / "rejected" / "bad.json.gz").read_bytes() == b"gz-bad"
    answer = (tmp_path / "rejected" / "bad.error.txt").read_text()
    assert answer.startswith("500\n") and "set aside after 7 answers of 500" in answer
    assert spool.counter("set_aside_batches") == 1 and spool.counter("set_aside_events") == 1
    assert metrics.set_aside_batches._value.get() == 1
    (report,) = spool.take_set_aside_reports("carrier")
    assert (report.batch_id, report.status, report.attempts) == ("bad", 500, 7)
    assert report.failing_s == 600 and "status 500" in report.answer


def test_pusher_keeps_a_batch_failing_with_500_too_few_times(tmp_path: Path) -> None:
    pusher, spool, clock, _, _ = _poison_pusher(tmp_path, _fails_for(b"gz-bad", 500))
    spool.put("bad", b"gz-bad", samples=1, events=0)
    spool.put("next", b"gz-next", samples=1, events=0)
    _retry(pusher, clock, times=4, every_s=1000)  # long, but only 4 answers
    assert spool.depth()[0] == 2
    assert spool.counter("set_aside_batches") == 0


@pytest.mark.parametrize("outage", [502, 503, 504, 507])
def test_pusher_never_sets_aside_a_batch_during_an_outage(tmp_path: Path, outage: int) -> None:
    pusher, spool, clock, _, _ = _poison_pusher(tmp_path, lambda request: outage)
    spool.put("a", b"gz-a", samples=1, events=0)
    spool.put("b", b"gz-b", samples=1, events=0)
    _retry(pusher, clock, times=50, every_s=100)
    assert spool.depth()[0] == 2
    assert not (tmp_path / "rejected").exists()


def test_pusher_sets_nothing_aside_when_the_server_fails_every_batch(tmp_path: Path) -> None:
    pusher, spool, clock, _, _ = _poison_pusher(tmp_path, lambda request: 500)
    spool.put("a", b"gz-a", samples=1, events=0)
    spool.put("b", b"gz-b", samples=1, events=0)
    _retry(pusher, clock, times=50, every_s=100)
    assert spool.depth()[0] == 2
    assert spool.counter("set_aside_batches") == 0


def test_pusher_keeps_a_suspect_batch_when_the_outage_returns_on_the_last_try(
    tmp_path: Path,
) -> None:
    answers = iter([500] * 5 + [200, 503])  # 5 x 500, the next batch taken, then 503

    def answer(request: httpx.Request) -> int:
        return next(answers, 200)

    pusher, spool, clock, _, pushed = _poison_pusher(tmp_path, answer)
    spool.put("bad", b"gz-bad", samples=1, events=0)
    spool.put("next", b"gz-next", samples=1, events=0)
    _retry(pusher, clock, times=5, every_s=150)
    assert pushed == [b"gz-next"]
    assert spool.depth()[0] == 1  # kept: the last answer was an outage
    pusher.drain()
    assert pushed == [b"gz-next", b"gz-bad"]


@pytest.mark.parametrize(("ready", "set_aside"), [(200, True), (503, False)])
def test_pusher_with_nothing_behind_a_suspect_batch_asks_readyz(
    tmp_path: Path, ready: int, set_aside: bool
) -> None:
    pusher, spool, clock, _, _ = _poison_pusher(tmp_path, lambda request: 500, ready=ready)
    spool.put("bad", b"gz-bad", samples=1, events=0)
    _retry(pusher, clock, times=7, every_s=100)
    assert spool.counter("set_aside_batches") == int(set_aside)
    assert spool.depth()[0] == int(not set_aside)
