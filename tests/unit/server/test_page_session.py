"""The fleet page's cookie holds a short-lived session, never the token; /report's CSP; and an
unknown token id is checked against a dummy hash like a wrong secret (no timing difference)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fleetwatch.errors import Unauthenticated
from fleetwatch.server import auth
from fleetwatch.server.auth import authenticate, authenticate_session, page_session
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.page import COOKIE


def _token_id(token: str) -> str:
    return token.split("_", 2)[1]


def test_an_expired_session_is_refused_and_dropped(
    client: TestClient, tokens: dict[str, str]
) -> None:
    old = page_session(
        tokens["read"], _token_id(tokens["read"]), now=utcnow() - timedelta(hours=13)
    )
    client.cookies.set(COOKIE, old)
    response = client.get("/")
    assert response.status_code == 401 and "session ended" in response.text
    assert response.headers["set-cookie"].startswith(f'{COOKIE}="";')
    fresh = page_session(tokens["read"], _token_id(tokens["read"]), now=utcnow())
    client.cookies.set(COOKIE, fresh)
    assert client.get("/").status_code == 200


def test_a_forged_session_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    good = page_session(tokens["read"], _token_id(tokens["read"]), now=utcnow())
    version, token_id, expires, mac = good.split(".")
    for forged in (
        f"{version}.{token_id}.{int(expires) + 86400}.{mac}",  # a longer life
        f"{version}.{_token_id(tokens['admin'])}.{expires}.{mac}",  # another token
        f"{version}.{token_id}.{expires}.{mac[:-2]}AA",  # a changed MAC
        tokens["read"],  # a raw token is not a session
    ):
        client.cookies.set(COOKIE, forged)
        assert client.get("/").status_code == 401, forged


def test_a_session_that_is_not_ascii_is_malformed_not_an_error(
    db: Database, tokens: dict[str, str]
) -> None:
    # httpx will not send such a cookie, but a raw client can (Starlette reads headers as latin-1).
    good = page_session(tokens["read"], _token_id(tokens["read"]), now=utcnow())
    version, token_id, expires, mac = good.split(".")
    for odd in (
        f"{version}.{token_id}.{expires}.{mac[:-1]}é",
        f"{version}.{token_id}.²{expires}.{mac}",
    ):
        with db.read() as conn, pytest.raises(Unauthenticated, match="malformed"):
            authenticate_session(conn, odd, now=utcnow())


def test_a_session_of_a_token_that_may_not_read_is_403(
    client: TestClient, tokens: dict[str, str]
) -> None:
    client.cookies.set(
        COOKIE, page_session(tokens["agent"], _token_id(tokens["agent"]), now=utcnow())
    )
    assert client.get("/").status_code == 403


def test_the_old_raw_token_cookie_is_ignored_and_deleted(
    client: TestClient, tokens: dict[str, str]
) -> None:
    client.cookies.set("fleetwatch_token", tokens["read"])
    response = client.get("/")
    assert response.status_code == 401
    assert 'fleetwatch_token="";' in response.headers["set-cookie"]


def test_report_page_sends_a_csp_that_allows_its_style_and_data_images_only(
    client: TestClient, tokens: dict[str, str]
) -> None:
    client.get("/", params={"token": tokens["read"]})
    report = client.get("/report")
    assert report.status_code == 200
    policy = report.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "img-src data:" in policy
    assert "unsafe-inline" not in policy and "script-src" not in policy
    assert "frame-ancestors 'none'" in policy
    styles = re.findall(r"<style[^>]*>(.*?)</style>", report.text, re.DOTALL)
    assert styles
    for block in styles:
        digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    images = re.findall(r'<img src="([^"]*)"', report.text)
    # The plots (PNG) and the fleet's pictures (SVG, drawn as images: no script of theirs runs).
    assert images and all(
        src.startswith(("data:image/png;base64,", "data:image/svg+xml;base64,")) for src in images
    )


class _SpyHmac:
    """``hmac`` for the auth module, recording what each constant-time comparison was given."""

    def __init__(self) -> None:
        self.compared: list[tuple[Any, Any]] = []
        self.new = hmac.new

    def compare_digest(self, a: Any, b: Any) -> bool:
        self.compared.append((a, b))
        return hmac.compare_digest(a, b)


def test_an_unknown_token_id_is_checked_against_the_dummy_hash(
    db: Database, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _SpyHmac()
    monkeypatch.setattr(auth, "hmac", spy)
    prefix, _, secret = tokens["read"].split("_", 2)
    unknown = f"{prefix}_000000000000_{secret}"
    with db.read() as conn, pytest.raises(Unauthenticated, match="unknown token"):
        authenticate(conn, unknown)
    presented = hashlib.sha256(unknown.encode()).hexdigest()
    assert spy.compared == [(presented, auth._DUMMY_DIGEST)]  # the same work as a wrong secret

    spy.compared.clear()
    wrong = f"{prefix}_{_token_id(tokens['read'])}_{'x' * len(secret)}"
    with db.read() as conn, pytest.raises(Unauthenticated, match="unknown token"):
        authenticate(conn, wrong)
    assert len(spy.compared) == 1 and spy.compared[0][1] != auth._DUMMY_DIGEST


def test_an_unknown_session_id_is_checked_against_the_dummy_hash(
    db: Database, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _SpyHmac()
    monkeypatch.setattr(auth, "hmac", spy)
    now = utcnow()
    session = page_session(tokens["read"], "000000000000", now=now)
    _, token_id, expires, mac = session.split(".")
    with db.read() as conn, pytest.raises(Unauthenticated, match="unknown session"):
        authenticate_session(conn, session, now=now)
    expected = auth._session_mac(auth._DUMMY_DIGEST, token_id, int(expires))
    assert spy.compared == [(mac, expected)]
    # Even a MAC made with the dummy key opens nothing: the id must exist.
    forged = f"v1.{token_id}.{expires}.{expected}"
    with db.read() as conn, pytest.raises(Unauthenticated):
        authenticate_session(conn, forged, now=now)
