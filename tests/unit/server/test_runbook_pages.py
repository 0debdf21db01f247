"""The server serves the runbook pages its alerts link to, without a token."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

PAGES = Path(__file__).resolve().parents[3] / "docs/runbooks"


def test_runbook_pages_are_served_as_written(client: TestClient) -> None:
    answer = client.get("/runbooks/xid")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text == (PAGES / "xid.md").read_text()
    # A relative link between pages (xid.md) resolves to the same page.
    assert client.get("/runbooks/xid.md").text == answer.text
    for index in ("/runbooks", "/runbooks/"):
        assert client.get(index).text == (PAGES / "index.md").read_text()


def test_runbook_unknown_or_outside_names_are_404(client: TestClient) -> None:
    assert client.get("/runbooks/no_such_alert").status_code == 404
    assert client.get("/runbooks/..%2FREADME").status_code == 404
