"""Verified tokens remembered briefly: a cache hit costs no query, a revocation bites in time.

The clock is injected everywhere; nothing here sleeps. The same across real server processes
(one revokes, another refuses within its TTL) is tests/integration/test_token_revocation_live.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from tests.conftest import bearer
from tests.factories import make_batch

from fleetwatch.errors import Unauthenticated
from fleetwatch.server.auth import TokenInfo, create_token, revoke_token
from fleetwatch.server.db.session import Database
from fleetwatch.server.token_cache import TokenCache

TTL = 5.0
CREATED = datetime(2026, 11, 30, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _info(token_id: str = "abc", scope: str = "agent") -> TokenInfo:
    return TokenInfo(token_id=token_id, name="n", scope=scope, created_at=CREATED)


def _refuse() -> TokenInfo:
    raise Unauthenticated("unknown token")


# -- the cache itself ---------------------------------------------------------------------------


def test_token_cache_remembers_a_checked_token_until_its_ttl() -> None:
    clock = FakeClock()
    cache = TokenCache(TTL, clock=clock)
    assert cache.get("fwt_abc_secret") is None
    assert cache.remember("fwt_abc_secret", _info) == _info()
    clock.now += TTL - 0.001
    assert cache.get("fwt_abc_secret") == _info()
    clock.now += 0.001
    assert cache.get("fwt_abc_secret") is None


def test_token_cache_ttl_counts_from_when_the_check_began() -> None:
    # A check that began before a revocation elsewhere may not see it: the entry must not
    # outlive that revocation by more than the TTL, however long the check took.
    clock = FakeClock()
    cache = TokenCache(TTL, clock=clock)

    def slow_check() -> TokenInfo:
        clock.now += 3.0
        return _info()

    began = clock.now
    cache.remember("fwt_abc_secret", slow_check)
    clock.now = began + TTL
    assert cache.get("fwt_abc_secret") is None


def test_token_cache_never_remembers_a_refusal() -> None:
    cache = TokenCache(TTL, clock=FakeClock())
    with pytest.raises(Unauthenticated):
        cache.remember("fwt_abc_wrong", _refuse)
    assert cache.get("fwt_abc_wrong") is None


def test_token_cache_keys_by_the_whole_token_and_holds_no_secret() -> None:
    cache = TokenCache(TTL, clock=FakeClock())
    cache.remember("fwt_abc_secret", _info)
    assert cache.get("fwt_abc_other") is None  # same id, another secret: not this entry
    assert "secret" not in repr(cache.__dict__)


def test_token_cache_forget_drops_the_token_at_once() -> None:
    cache = TokenCache(TTL, clock=FakeClock())
    cache.remember("fwt_abc_secret", _info)
    cache.remember("fwt_def_secret", lambda: _info("def"))
    cache.forget("abc")
    assert cache.get("fwt_abc_secret") is None
    assert cache.get("fwt_def_secret") == _info("def")


def test_token_cache_forgets_a_check_that_a_revocation_overtook() -> None:
    cache = TokenCache(TTL, clock=FakeClock())

    def check_while_revoked() -> TokenInfo:
        cache.forget("abc")  # this process revokes it while the check reads the old row
        return _info()

    assert cache.remember("fwt_abc_secret", check_while_revoked) == _info()
    assert cache.get("fwt_abc_secret") is None


def test_token_cache_with_zero_ttl_remembers_nothing() -> None:
    cache = TokenCache(0, clock=FakeClock())
    cache.remember("fwt_abc_secret", _info)
    assert cache.get("fwt_abc_secret") is None


def test_token_cache_stays_bounded() -> None:
    clock = FakeClock()
    cache = TokenCache(TTL, clock=clock, max_entries=3)
    for i in range(3):
        cache.remember(f"fwt_{i}_s", lambda i=i: _info(str(i)))
    clock.now += TTL  # all three expired: dropped to make room
    cache.remember("fwt_new_s", lambda: _info("new"))
    assert len(cache._entries) == 1
    for i in range(3):  # all fresh and full: the cache starts afresh rather than grow
        cache.remember(f"fwt_x{i}_s", lambda i=i: _info(f"x{i}"))
    assert len(cache._entries) <= 3
    assert cache.get("fwt_x2_s") == _info("x2")


# -- in the app ---------------------------------------------------------------------------------


@pytest.fixture
def clock(client: TestClient) -> FakeClock:
    """The app's token cache, on a clock the test moves."""
    fake = FakeClock()
    client.app.state.token_cache = TokenCache(TTL, clock=fake)  # type: ignore[attr-defined]
    return fake


@pytest.fixture
def token_queries(db: Database) -> Iterator[list[str]]:
    """Every statement that reads api_tokens, as it is sent to the database."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "api_tokens" in statement and statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    yield seen
    event.remove(db.engine, "before_cursor_execute", record)


def _agent_token(db: Database, name: str = "cached-agent") -> tuple[str, TokenInfo]:
    with db.write() as conn:
        return create_token(conn, name=name, scope="agent")


def _push(client: TestClient, token: str) -> int:
    return client.post(
        "/v1/ingest", json=make_batch("node-a", gpus=1), headers=bearer(token)
    ).status_code


def test_auth_cache_hit_costs_no_token_query(
    client: TestClient, db: Database, clock: FakeClock, token_queries: list[str]
) -> None:
    token, _ = _agent_token(db)
    assert _push(client, token) == 200
    looked_up = len(token_queries)
    assert looked_up > 0
    for _ in range(3):
        assert _push(client, token) == 200
    assert len(token_queries) == looked_up
    clock.now += TTL  # expired: checked again
    assert _push(client, token) == 200
    assert len(token_queries) > looked_up


def test_auth_token_revoked_elsewhere_is_refused_once_the_ttl_passes(
    client: TestClient, db: Database, clock: FakeClock
) -> None:
    token, info = _agent_token(db)
    assert _push(client, token) == 200
    with db.write() as conn:  # as another server process or `fleetwatch token revoke` does
        revoke_token(conn, info.token_id)
    clock.now += TTL - 0.001
    assert _push(client, token) == 200  # still remembered: the price of no query per request
    clock.now += 0.001
    response = client.post("/v1/ingest", json=make_batch("node-a"), headers=bearer(token))
    assert response.status_code == 401 and "revoked" in response.json()["error"]


def test_auth_token_revoked_through_this_process_is_refused_at_once(
    client: TestClient, db: Database, clock: FakeClock, tokens: dict[str, str]
) -> None:
    token, info = _agent_token(db)
    assert _push(client, token) == 200
    revoked = client.delete(f"/v1/tokens/{info.token_id}", headers=bearer(tokens["admin"]))
    assert revoked.status_code == 200, revoked.text
    assert _push(client, token) == 401


def test_auth_cached_token_keeps_its_scope(
    client: TestClient, db: Database, clock: FakeClock
) -> None:
    token, _ = _agent_token(db)
    assert _push(client, token) == 200
    response = client.get("/v1/nodes", headers=bearer(token))
    assert response.status_code == 403, response.text


def test_auth_wrong_secret_of_a_cached_token_is_refused(
    client: TestClient, db: Database, clock: FakeClock
) -> None:
    token, _ = _agent_token(db)
    assert _push(client, token) == 200
    tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert _push(client, tampered) == 401
