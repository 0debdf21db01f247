"""No credential reaches the log of a real `fleetwatch server` process, whichever process wrote it.

The fleet page's documented link ``/?token=fwt_...`` (with a read token and with an admin one), a
refused token in the same place, credential-looking query parameters on an API route, a token in
a path, and the Authorization and Cookie headers: the server's whole output (uvicorn's access and
error logs and FleetWatch's own, stdout and stderr) is read back and holds none of them, while
each request's line is still there with the credential masked. On PostgreSQL the same runs
against two worker processes, each of which configures its own logging.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.integration.live import LiveServer, create_token, live_server

pytestmark = pytest.mark.slow

MASK = "[REDACTED]"
OTHER_SECRETS = ("s3cret-api-key", "hunter2-password", "client-secret-value", "session-cookie-v")


def _visit(live: LiveServer, read: str, admin: str, agent: str) -> int:
    """The requests that carry credentials; how many answers came back."""
    answers = []
    with httpx.Client(base_url=live.url, timeout=30, follow_redirects=False) as browser:
        answers.append(browser.get("/", params={"token": read}))
        answers.append(browser.get("/", params={"token": admin}))
        answers.append(browser.get("/", params={"horizon": "7d", "token": "fwt_0123456789ab_nope"}))
        answers.append(
            browser.get(
                "/v1/nodes",
                params={
                    "access_token": read,
                    "api_key": OTHER_SECRETS[0],
                    "password": OTHER_SECRETS[1],
                    "client_secret": OTHER_SECRETS[2],
                },
                headers={"Authorization": f"Bearer {read}"},
            )
        )
        answers.append(
            browser.get(f"/v1/nodes/{agent}", headers={"Authorization": f"Bearer {admin}"})
        )
        answers.append(
            browser.get(
                "/v1/nodes",
                headers={
                    "Authorization": f"Bearer {admin}",
                    "Cookie": f"fleetwatch_session={OTHER_SECRETS[3]}; fleetwatch_token={agent}",
                },
            )
        )
    return sum(answer.status_code < 500 for answer in answers)


def _assert_clean(log: str, *tokens: str) -> None:
    for token in tokens:
        secret = token.split("_", 2)[2]  # fwt_<id>_<secret>
        assert token not in log
        assert secret not in log
    for secret in OTHER_SECRETS:
        assert secret not in log
    assert f'"GET /?token={MASK} HTTP/1.1" 303' in log
    assert f'"GET /?horizon=7d&token={MASK} HTTP/1.1" 401' in log
    assert f"access_token={MASK}&api_key={MASK}&password={MASK}&client_secret={MASK}" in log
    assert f'"GET /v1/nodes/fwt_{MASK} HTTP/1.1" 404' in log


def test_no_credential_reaches_the_log(tmp_path: Path, migrated_sqlite_file: Path) -> None:
    path = tmp_path / "fleetwatch.db"
    shutil.copyfile(migrated_sqlite_file, path)
    url = f"sqlite:///{path}"
    read, admin = create_token(url, "read"), create_token(url, "admin")
    agent = create_token(url, "agent")
    with live_server(url, tmp_path) as live:
        assert _visit(live, read, admin, agent) == 6
    _assert_clean(live.log.read_text(errors="replace"), read, admin, agent)


@pytest.mark.postgres
def test_no_worker_process_logs_a_credential(migrated_postgres_url: str, tmp_path: Path) -> None:
    """Each worker builds its logging from the configuration uvicorn hands it; which worker takes
    a connection is the kernel's choice, so every request's line is checked, whoever wrote it."""
    url = migrated_postgres_url
    read, admin = create_token(url, "read"), create_token(url, "admin")
    agent = create_token(url, "agent")
    with live_server(url, tmp_path, "--workers", "2") as live:
        for _ in range(5):  # new connections each round, spread by the kernel
            assert _visit(live, read, admin, agent) == 6
    log = live.log.read_text(errors="replace")
    _assert_clean(log, read, admin, agent)
    assert log.count(f'"GET /?token={MASK} HTTP/1.1" 303') == 10
