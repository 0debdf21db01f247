"""``SyncEngine`` and ``SchedulerClient`` without a scheduler: an in-memory ``NodeBackend`` and
``httpx.MockTransport`` as the server (the seam the agent's pusher tests use too)."""

from __future__ import annotations

import json
import logging
import threading
from typing import ClassVar

import httpx
import pytest

from fleetwatch.adapters.client import Eviction, SchedulerApiError, SchedulerClient
from fleetwatch.adapters.sync import Hold, HoldKind, SyncEngine


class MemoryBackend:
    name: ClassVar[str] = "memory"

    def __init__(self, holds: dict[str, Hold]) -> None:
        self.holds = holds
        self.actions: list[tuple[str, str]] = []

    def inspect(self, node: str) -> Hold:
        return self.holds.get(node, Hold(HoldKind.MISSING))

    def snapshot(self) -> dict[str, Hold]:
        return dict(self.holds)

    def hold(self, eviction: Eviction) -> None:
        self.actions.append(("hold", eviction.node))
        self.holds[eviction.node] = Hold(HoldKind.OURS)

    def release(self, node: str) -> None:
        self.actions.append(("release", node))
        self.holds[node] = Hold(HoldKind.FREE)


def eviction(id: int, node: str, state: str) -> dict[str, object]:
    return {"id": id, "node": node, "state": state, "reason_kind": "risk", "reason": "p=0.4",
            "evidence": None, "dry_run": False}  # fmt: skip


def test_client_sends_the_contract_and_raises_one_line_errors() -> None:
    seen: list[httpx.Request] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/evictions/7/reject":
            return httpx.Response(409, json={"error_code": "conflict", "message": "is completed"})
        return httpx.Response(200, json={"count": 1, "data": [eviction(7, "n1", "pending")]})

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    client = SchedulerClient(http)
    [listed] = client.list_evictions("pending", limit=3)
    assert listed.node == "n1" and listed.evidence is None
    assert str(seen[0].url) == "http://fw/v1/evictions?state=pending&limit=3"
    with pytest.raises(SchedulerApiError) as caught:
        client.reject(7, "no")
    assert json.loads(seen[1].content) == {"reason": "no"}
    assert str(caught.value) == "POST /v1/evictions/7/reject: HTTP 409: is completed"
    assert caught.value.status_code == 409 and caught.value.exit_code == 4


def test_engine_loop_survives_an_unreachable_server(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    calls = 0

    def server(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls >= 3:
            stop.set()
        raise httpx.ConnectError("connection refused", request=request)

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}))
    with caplog.at_level(logging.ERROR):
        engine.run_forever(stop, interval_s=0.01)
    assert calls == 3
    assert caplog.messages[0] == (
        "memory sync pass failed: GET /v1/evictions: ConnectError: connection refused"
    )


def test_engine_releases_only_for_the_newest_eviction_of_a_node() -> None:
    listed = {
        "pending": [],
        "completed": [eviction(5, "n1", "completed")],
        "returned": [eviction(3, "n1", "returned"), eviction(4, "n2", "returned")],
    }

    def server(request: httpx.Request) -> httpx.Response:
        data = listed[request.url.params["state"]]
        return httpx.Response(200, json={"count": len(data), "data": data})

    backend = MemoryBackend({"n1": Hold(HoldKind.OURS), "n2": Hold(HoldKind.OURS)})
    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    report = SyncEngine(SchedulerClient(http), backend).run_pass()
    assert backend.actions == [("release", "n2")]
    assert report.released == ["n2"] and report.errors == []


class CountingStop(threading.Event):
    """A stop event that records how long the loop sleeps, and stops it after ``sleeps``."""

    def __init__(self, sleeps: int) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self._left = sleeps

    def wait(self, timeout: float | None = None) -> bool:
        self.sleeps.append(-1.0 if timeout is None else timeout)
        self._left -= 1
        if self._left <= 0:
            self.set()
        return self.is_set()


def test_engine_waits_on_the_long_poll_with_a_read_timeout_that_outlasts_it() -> None:
    seen: list[httpx.Request] = []

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"count": 0, "data": []})

    http = httpx.Client(base_url="http://fw", timeout=10.0, transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}))
    assert engine.wait_for_work(CountingStop(sleeps=1), interval_s=5.0) is False
    [poll] = seen
    assert poll.url.params["wait"] == "5" and poll.url.params["state"] == "pending"
    assert poll.extensions["timeout"]["read"] == 15.0  # 10 s of the client + the 5 s held


def test_engine_passes_at_once_when_the_long_poll_brings_a_new_eviction() -> None:
    pending = [eviction(1, "n1", "pending")]

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/evictions" and "wait" in request.url.params:
            return httpx.Response(200, json={"count": 1, "data": [eviction(2, "n2", "pending")]})
        state = request.url.params.get("state")
        data = pending if state == "pending" else []
        return httpx.Response(200, json={"count": len(data), "data": data})

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}), dry_run=True)
    engine.run_pass()  # sees eviction 1 only
    stop = CountingStop(sleeps=1)
    assert engine.wait_for_work(stop, interval_s=5.0) is True
    assert stop.sleeps == [], "a new eviction must not wait out the interval"


@pytest.mark.parametrize("answer", ["ignores_wait", "same_pending", "error"])
def test_engine_never_spins_when_the_long_poll_answers_early(answer: str) -> None:
    """An old server that ignores ``wait``, pending evictions the pass cannot take (here a dry
    run), or a failing long-poll: every pass is followed by a sleep of the interval."""
    gets: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        gets.append(str(request.url))
        if "wait" in request.url.params and answer == "error":
            return httpx.Response(500, json={"message": "boom"})
        data = [eviction(1, "n1", "pending")] if answer == "same_pending" else []
        if request.url.params.get("state") != "pending":
            data = []
        return httpx.Response(200, json={"count": len(data), "data": data})

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}), dry_run=True)
    stop = CountingStop(sleeps=3)
    engine.run_forever(stop, interval_s=0.5)
    polls = [url for url in gets if "wait=" in url]
    assert len(polls) == 3, gets  # one long-poll per pass, each followed by a sleep
    assert len(stop.sleeps) == 3 and all(0 < s <= 0.5 for s in stop.sleeps), stop.sleeps


def test_engine_waits_for_a_drain_or_a_return_since_its_pass_began() -> None:
    """A server with change cursors: the wait asks for pending or returned evictions changed
    after the cursor of the pass's first read, and a return ends it at once."""
    polls: list[httpx.Request] = []

    def server(request: httpx.Request) -> httpx.Response:
        if "wait" in request.url.params:
            polls.append(request)
            data = [eviction(3, "n3", "returned")]
            return httpx.Response(200, json={"count": 1, "data": data, "cursor": 9})
        return httpx.Response(200, json={"count": 0, "data": [], "cursor": 7})

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}))
    engine.run_pass()
    stop = CountingStop(sleeps=1)
    assert engine.wait_for_work(stop, interval_s=5.0) is True
    assert stop.sleeps == [], "a return must not wait out the interval"
    [poll] = polls
    assert poll.url.params.get_list("state") == ["pending", "returned"]
    assert (poll.url.params["changed_after"], poll.url.params["wait"]) == ("7", "5")


def test_engine_sleeps_out_the_interval_when_nothing_changed_since_its_cursor() -> None:
    """The long-poll answers empty (here at once, as a capped server may): one sleep, no spin."""

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"count": 0, "data": [], "cursor": 7})

    http = httpx.Client(base_url="http://fw", transport=httpx.MockTransport(server))
    engine = SyncEngine(SchedulerClient(http), MemoryBackend({}))
    engine.run_pass()
    stop = CountingStop(sleeps=1)
    assert engine.wait_for_work(stop, interval_s=5.0) is False
    assert len(stop.sleeps) == 1 and 0 < stop.sleeps[0] <= 5.0
