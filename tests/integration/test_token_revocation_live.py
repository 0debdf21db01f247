"""A token revoked by one process is refused by another server process within its token cache's
TTL: real `fleetwatch server` processes on one PostgreSQL, and the real `fleetwatch token revoke`.

Two servers: one remembers tokens for 5 minutes (it shows the cache is real: a token revoked
elsewhere still works there), one for 1 s. After a revocation the test waits until 1 s has
passed since it was sent, then asks: the short-lived server must refuse. That wait is a lower
bound, not a race: the server's entry was made before the revocation, so it has expired by then,
whatever the machine's load (both processes read the same monotonic clock).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.factories import make_batch
from tests.integration.live import LiveServer, create_token, fleetwatch, live_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

TTL_ENV = "FLEETWATCH_SERVER_TOKEN_CACHE_TTL_S"
SHORT_TTL_S = 1.0


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {
        "ASSESS_INTERVAL_S": "3600",  # background jobs idle: two servers share 2 cores
        "STRAGGLER_INTERVAL_S": "3600",
        "ROLLUP_INTERVAL_S": "3600",
        "LIFECYCLE_INTERVAL_S": "3600",
        "REFIT_INTERVAL_S": "0",
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return migrated_postgres_url


def _push(server: LiveServer, token: str) -> int:
    with server.client(token) as client:
        return client.post("/v1/ingest", json=make_batch("node-revoke", gpus=1)).status_code


def _wait_until(moment: float) -> None:
    """Sleep until time.monotonic() reaches ``moment`` (the same clock the servers read)."""
    while (left := moment - time.monotonic()) > 0:
        time.sleep(left)


def test_token_revoked_by_one_process_is_refused_by_another_within_its_ttl(
    pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = create_token(pg_db, "admin", "revoke-admin")
    by_api = create_token(pg_db, "agent", "revoke-by-api")
    by_cli = create_token(pg_db, "agent", "revoke-by-cli")
    with ExitStack() as stack:
        monkeypatch.setenv(TTL_ENV, "300")
        remembering = stack.enter_context(live_server(pg_db, tmp_path))
        monkeypatch.setenv(TTL_ENV, str(SHORT_TTL_S))
        short = stack.enter_context(live_server(pg_db, tmp_path))
        for token in (by_api, by_cli):
            for server in (remembering, short):
                assert _push(server, token) == 200  # checked, and now remembered

        # Revoked through one server's API: refused there at once, by the other within its TTL.
        sent = time.monotonic()
        with remembering.client(admin) as client:
            assert client.delete("/v1/tokens/revoke-by-api").status_code == 200
        assert _push(remembering, by_api) == 401
        _wait_until(sent + SHORT_TTL_S)
        assert _push(short, by_api) == 401

        # Revoked by the CLI (another process): the server that remembers for 5 minutes still
        # takes it, the one that remembers for 1 s refuses it once that second has passed.
        sent = time.monotonic()
        fleetwatch("token", "revoke", "revoke-by-cli", "--database-url", pg_db)
        assert _push(remembering, by_cli) == 200
        _wait_until(sent + SHORT_TTL_S)
        assert _push(short, by_cli) == 401
