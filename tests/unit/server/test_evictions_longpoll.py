"""GET /v1/evictions?wait=N: a long-poll that answers when a matching eviction appears.

On PostgreSQL the eviction is created through a connection of its own (not the app's engine,
not its planner): only the database's NOTIFY can wake the waiting request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from tests.conftest import bearer

from fleetwatch.config import ServerSettings
from fleetwatch.server.act.eviction_watch import EvictionWatch
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.evictions import create_eviction


def _create(database_url: str, node: str, state: str = "pending") -> int:
    """An eviction written by another connection, as another replica would write it."""
    engine = create_engine(database_url)
    try:
        db = Database(engine)
        with db.write() as conn:
            return create_eviction(
                conn, node=node, state=state, reason_kind="rule", reason="xid_79 on GPU 1",
                evidence={}, expected_saving_usd=None, dry_run=False, now=utcnow(),
            )  # fmt: skip
    finally:
        engine.dispose()


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class _Poll(threading.Thread):
    """A long-poll in a thread of its own; ``response`` once it is answered."""

    def __init__(self, client: TestClient, headers: dict[str, str], **params: Any) -> None:
        super().__init__(daemon=True)
        self.client, self.headers, self.params = client, headers, params
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = self.client.get("/v1/evictions", params=self.params, headers=self.headers)


def _watch(client: TestClient) -> EvictionWatch:
    watch: EvictionWatch = client.app.state.eviction_watch  # type: ignore[attr-defined]
    return watch


def _waiting(client: TestClient) -> bool:
    return bool(_watch(client)._waiters)


def test_long_poll_answers_at_once_when_something_matches(
    client: TestClient, database_url: str, tokens: dict[str, str]
) -> None:
    made = _create(database_url, "node-a")
    # wait=60 would hold the test for a minute if the match were not answered at once.
    response = client.get("/v1/evictions", params={"state": "pending", "wait": 60},
                          headers=bearer(tokens["scheduler"]))  # fmt: skip
    assert response.status_code == 200, response.text
    assert [e["id"] for e in response.json()["data"]] == [made]


def test_long_poll_is_released_by_an_eviction_from_another_connection(
    client: TestClient, database_url: str, tokens: dict[str, str]
) -> None:
    poll = _Poll(client, bearer(tokens["scheduler"]), state="pending", wait=60)
    poll.start()
    _until(lambda: _waiting(client), "the long-poll to wait")
    # Not matching: a paged eviction wakes the waiter, which reads again and keeps waiting.
    _create(database_url, "node-p", state="paged")
    made = _create(database_url, "node-b")
    poll.join(timeout=45)
    assert poll.response is not None, "the long-poll was not released by the new eviction"
    assert poll.response.status_code == 200, poll.response.text
    body = poll.response.json()
    assert body["count"] == 1 and body["data"][0]["id"] == made
    assert body["data"][0]["node"] == "node-b"


def test_long_poll_times_out_with_an_empty_list(
    client: TestClient, database_url: str, tokens: dict[str, str]
) -> None:
    _create(database_url, "node-c", state="completed")  # another state: no match
    response = client.get("/v1/evictions", params={"state": "pending", "wait": 0.5},
                          headers=bearer(tokens["scheduler"]))  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json() == {"count": 0, "data": []}
    assert not _waiting(client), "a finished long-poll left its waiter behind"


@pytest.mark.parametrize("wait", ["-1", "60.5", "61", "soon"])
def test_long_poll_refuses_a_bad_wait(
    client: TestClient, tokens: dict[str, str], wait: str
) -> None:
    response = client.get("/v1/evictions", params={"state": "pending", "wait": wait},
                          headers=bearer(tokens["scheduler"]))  # fmt: skip
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "wait"]


def test_long_poll_ends_when_the_server_stops(client: TestClient, tokens: dict[str, str]) -> None:
    poll = _Poll(client, bearer(tokens["scheduler"]), state="pending", wait=60)
    poll.start()
    _until(lambda: _waiting(client), "the long-poll to wait")
    _watch(client).stop()  # what the lifespan does at shutdown, and SIGINT/SIGTERM at once
    poll.join(timeout=30)
    assert poll.response is not None, "the long-poll outlived the server's stop"
    assert poll.response.json() == {"count": 0, "data": []}


def test_long_poll_is_held_no_longer_than_long_poll_max_s(settings: ServerSettings) -> None:
    capped = settings.model_copy(update={"long_poll_max_s": 0.1})
    with TestClient(create_app(capped)) as client:
        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            token, _ = create_token(conn, name="sched", scope="scheduler")
        # wait=60 would hold the test for a minute without the cap
        response = client.get("/v1/evictions", params={"state": "pending", "wait": 60},
                              headers=bearer(token))  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.json() == {"count": 0, "data": []}
