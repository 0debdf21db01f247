"""The fleet page at /: sign-in and cookie, what it shows, and escaping, on both databases."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _xid_batch

from fleetwatch.server.auth import revoke_token
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import nodes, stragglers
from fleetwatch.server.page import COOKIE
from fleetwatch.server.repo.evictions import create_eviction


def _section(html: str, heading: str) -> str:
    """The HTML of the page section whose <h2> starts with ``heading``."""
    start = html.index(f"<h2>{heading}")
    return html[start : html.index("</section>", start)]


def _sign_in(client: TestClient, token: str) -> None:
    response = client.get("/", params={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/"


def _eviction(db: Database, node: str, reason: str, state: str = "pending") -> int:
    with db.write() as conn:
        return create_eviction(
            conn, node=node, state=state, reason_kind="rule", reason=reason,
            evidence={}, expected_saving_usd=None, dry_run=False, now=utcnow(),
        )  # fmt: skip


def test_page_without_a_token_is_a_401_sign_in_form(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("text/html")
    assert '<form class="signin" method="post" action="/signin">' in response.text
    assert "not accepted" not in response.text  # nothing was tried yet
    assert "script-src" not in response.headers["content-security-policy"]
    assert "default-src 'none'" in response.headers["content-security-policy"]


def test_token_in_the_query_becomes_an_httponly_strict_cookie(
    client: TestClient, tokens: dict[str, str], push: Push
) -> None:
    assert push(make_batch("node-a", gpus=2, labels={"rack": "r07"})).status_code == 200
    response = client.get("/", params={"token": tokens["read"]}, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/"  # the token leaves the address bar
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=v1.") and tokens["read"] not in cookie  # a session
    assert "Max-Age=43200" in cookie  # 12 h
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain http here; https would add it
    assert response.headers["referrer-policy"] == "no-referrer"

    page = client.get("/")  # the client sends the cookie back, as a browser does
    assert page.status_code == 200, page.text
    assert page.headers["cache-control"] == "no-store"
    fleet = _section(page.text, "Fleet")
    assert "r07" in fleet and "node-a" in fleet
    assert re.search(r"<b class=\"ok\">1</b>nodes up", fleet)
    assert re.search(r"<b>2</b>GPUs", fleet)
    assert "model none (rules only)" in page.text
    assert '<meta http-equiv="refresh"' in page.text
    # No model and no verdict: no GPU row, and the missing model said once.
    assert "Risk: top 0 of 0 GPUs" in page.text
    assert page.text.count("No fitted model yet") == 1
    assert "no fitted model yet" not in page.text


def test_query_token_keeps_the_other_parameters(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.get(
        "/", params={"token": tokens["read"], "horizon": "7d"}, follow_redirects=False
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/?horizon=7d"
    assert "<b>7d</b>" in client.get("/?horizon=7d").text


def test_a_bearer_header_also_reads_the_page(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.get("/", headers=bearer(tokens["admin"])).status_code == 200


@pytest.mark.parametrize("bad", ["fwt_000000000000_nope", "not-a-token"])
def test_a_bad_query_token_sets_no_cookie(client: TestClient, bad: str) -> None:
    response = client.get("/", params={"token": bad}, follow_redirects=False)
    assert response.status_code == 401
    assert "set-cookie" not in response.headers
    assert "not accepted" in response.text


def test_a_token_that_may_not_read_gets_403_and_the_form(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.get("/", params={"token": tokens["agent"]}, follow_redirects=False)
    assert response.status_code == 403
    assert "set-cookie" not in response.headers
    assert "&#39;agent&#39; token cannot read" in response.text


def test_sign_in_form_posts_the_token_into_the_cookie(
    client: TestClient, tokens: dict[str, str]
) -> None:
    refused = client.post("/signin", data={"token": "fwt_x_y"}, follow_redirects=False)
    assert refused.status_code == 401 and "set-cookie" not in refused.headers
    assert client.post("/signin", data={}, follow_redirects=False).status_code == 401
    response = client.post("/signin", data={"token": tokens["read"]}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    assert "HttpOnly" in response.headers["set-cookie"]
    assert client.get("/").status_code == 200


def test_a_revoked_token_in_the_cookie_is_dropped(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    _sign_in(client, tokens["read"])
    assert client.get("/").status_code == 200
    with db.write() as conn:
        revoke_token(conn, "test-read")
    response = client.get("/")
    assert response.status_code == 401 and "session ended" in response.text
    assert response.headers["set-cookie"].startswith(f'{COOKIE}="";')  # deleted
    assert client.get("/").status_code == 401


def test_insecure_no_auth_needs_no_token(make_client: Callable[..., TestClient]) -> None:
    open_client = make_client(insecure_no_auth=True)
    assert open_client.get("/").status_code == 200
    redirect = open_client.get("/?token=anything", follow_redirects=False)
    assert redirect.status_code == 303 and "set-cookie" not in redirect.headers


def test_a_fatal_xid_is_first_in_risk_and_listed_as_a_fatal_event(
    client: TestClient, tokens: dict[str, str], push: Push
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    _sign_in(client, tokens["read"])
    html = client.get("/").text

    risk = _section(html, "Risk")
    row = (
        r"<tr>\s*<td class=\"num ?(?:bad)?\">(.*?)</td>\s*<td>(\w+)</td>"
        r"\s*<td class=\"node\"><a class=\"node\" href=\"/nodes/([^\"]*)\">(.*?)</a></td>"
        r"\s*<td class=\"num\" title=\"[^\"]*\">(\d+)</td>"
    )
    rows = re.findall(row, risk)
    # Only the GPU with a verdict: with no model, node-b's GPUs have nothing to say.
    assert rows == [("1.000", "rule", "node-a", "node-a", "1")], rows
    assert "Xid 79" in risk
    assert risk.count("No fitted model yet") == 1

    api = client.get("/v1/risk", headers=bearer(tokens["read"])).json()
    assert (api["gpus"][0]["node"], str(api["gpus"][0]["index"])) == (rows[0][3], rows[0][4])

    fatal = _section(html, "Fatal Xid events")
    assert "node-a" in fatal and '<td class="num bad">79</td>' in fatal
    assert "NVRM: Xid" in fatal
    assert re.search(r"<b class=\"bad\">1</b>GPUs out by rule", html)


def test_an_old_or_harmless_xid_is_not_a_fatal_event(
    client: TestClient, tokens: dict[str, str], push: Push
) -> None:
    assert push(_xid_batch("node-a", 79, minutes_ago=25 * 60)).status_code == 200
    assert push(_xid_batch("node-b", 13)).status_code == 200  # application fault
    _sign_in(client, tokens["read"])
    assert '<p class="empty">None.</p>' in _section(client.get("/").text, "Fatal Xid events")


def test_pending_and_paged_evictions_and_open_stragglers_show(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    _eviction(db, "node-b", "Xid 79: fallen off the bus")
    _eviction(db, "node-c", "drain budget exhausted", state="paged")
    _eviction(db, "node-d", "already done", state="completed")
    now = datetime.now(UTC)
    with db.write() as conn:
        for node, ended in (("node-e", None), ("node-f", now)):
            conn.execute(insert(stragglers).values(
                job_id="job-7", node=node, kind="hardware", started_at=now - timedelta(hours=1),
                updated_at=now, ended_at=ended, windows=4, ratio=1.8,
            ))  # fmt: skip
    _sign_in(client, tokens["read"])
    html = client.get("/").text
    waiting = _section(html, "Evictions waiting")
    assert "node-b" in waiting and "pending" in waiting and "fallen off the bus" in waiting
    assert "node-c" in waiting and "paged" in waiting
    assert "node-d" not in waiting
    slow = _section(html, "Active stragglers")
    assert "job-7" in slow and "node-e" in slow and "1.80" in slow
    assert "node-f" not in slow


def test_every_value_is_escaped(client: TestClient, db: Database, tokens: dict[str, str]) -> None:
    hostile = "<script>alert(1)</script>"
    now = datetime.now(UTC)
    with db.write() as conn:
        conn.execute(insert(nodes).values(
            name=hostile, labels={"rack": '"><img src=x onerror=alert(2)>'}, interval_s=10.0,
            first_seen=now, last_seen=now,
        ))  # fmt: skip
    _eviction(db, hostile, "<b>bold</b> & co")
    _sign_in(client, tokens["read"])
    html = client.get("/").text
    assert "<script>" not in html and "<img" not in html and "<b>bold" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in _section(html, "Fleet")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in _section(html, "Evictions waiting")
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html


def test_weekly_report_link_only_when_the_route_exists(
    client: TestClient, tokens: dict[str, str]
) -> None:
    _sign_in(client, tokens["read"])
    html = client.get("/").text
    assert '<a href="/docs">API docs</a>' in html
    has_route = any(
        getattr(r, "path", "") == "/v1/reports/weekly"
        for r in client.app.routes  # type: ignore[attr-defined]
    )
    assert ('href="/report"' in html) is has_route
    if has_route:  # the link works with the cookie alone, as a browser follows it
        report = client.get("/report")
        assert report.status_code == 200 and "text/html" in report.headers["content-type"]
    client.cookies.clear()
    assert client.get("/report").status_code == 401
