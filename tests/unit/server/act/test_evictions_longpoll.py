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
from tests.factories import store_validation_now

from fleetwatch.config import ServerSettings
from fleetwatch.server.act.eviction_watch import EvictionWatch
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.evictions import ack_eviction, create_eviction, return_node


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


def _return(database_url: str, node: str) -> None:
    """The node's completed eviction returned through another connection (another replica)."""
    engine = create_engine(database_url)
    try:
        with Database(engine).write() as conn:
            store_validation_now(conn, node)  # the gate: a passing validation first
            return_node(conn, node, actor="ops", note="repaired", now=utcnow())
    finally:
        engine.dispose()


def _ack(database_url: str, eviction_id: int) -> None:
    engine = create_engine(database_url)
    try:
        with Database(engine).write() as conn:
            ack_eviction(conn, eviction_id, claimer="other-adapter", lease_s=300, now=utcnow())
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


def _empty(body: dict[str, Any]) -> bool:
    return body["count"] == 0 and body["data"] == [] and body["cursor"] >= 0


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
    assert _empty(response.json())
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
    assert _empty(poll.response.json())


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
        assert _empty(response.json())


def test_several_states_and_a_cursor_list_only_what_changed_since(
    client: TestClient, database_url: str, tokens: dict[str, str]
) -> None:
    pending = _create(database_url, "node-a")
    returned = _create(database_url, "node-b", state="returned")
    _create(database_url, "node-c", state="completed")
    headers = bearer(tokens["scheduler"])
    wanted = {"state": ["pending", "returned"]}
    body = client.get("/v1/evictions", params=wanted, headers=headers).json()
    assert [e["id"] for e in body["data"]] == [returned, pending]
    cursor = body["cursor"]
    since = client.get(
        "/v1/evictions", params={**wanted, "changed_after": cursor}, headers=headers
    ).json()
    assert since["data"] == [] and since["cursor"] == cursor
    newer = _create(database_url, "node-d")
    since = client.get(
        "/v1/evictions", params={**wanted, "changed_after": cursor}, headers=headers
    ).json()
    assert [e["id"] for e in since["data"]] == [newer] and since["cursor"] > cursor


def test_long_poll_with_a_cursor_wakes_on_a_return_not_on_what_was_read(
    client: TestClient, database_url: str, tokens: dict[str, str]
) -> None:
    """What a scheduler adapter waits on: pending or returned, changed since its last pass."""
    pending = _create(database_url, "node-a")
    drained = _create(database_url, "node-b", state="completed")
    headers = bearer(tokens["scheduler"])
    cursor = client.get("/v1/evictions", headers=headers).json()["cursor"]
    poll = _Poll(client, headers, state=["pending", "returned"], changed_after=cursor, wait=60)
    poll.start()
    _until(lambda: _waiting(client), "the long-poll to wait")
    # The pending eviction was there before the cursor, and acking it is no change to a listed
    # state: the poll keeps waiting through both.
    _ack(database_url, pending)
    _return(database_url, "node-b")
    poll.join(timeout=45)
    assert poll.response is not None, "the long-poll was not released by the return"
    assert poll.response.status_code == 200, poll.response.text
    body = poll.response.json()
    assert [(e["id"], e["state"]) for e in body["data"]] == [(drained, "returned")]
    assert body["cursor"] > cursor


@pytest.mark.parametrize("changed_after", ["-1", "soon", str(2**63)])
def test_a_bad_cursor_is_refused(
    client: TestClient, tokens: dict[str, str], changed_after: str
) -> None:
    params = {"changed_after": changed_after}
    response = client.get("/v1/evictions", params=params, headers=bearer(tokens["scheduler"]))
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "changed_after"]
