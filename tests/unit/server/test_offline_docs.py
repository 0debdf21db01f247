"""``/docs`` and ``/redoc`` work air-gapped: every asset they reference is served by this server."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

# src="..." / href="..." / spec-url="..." attributes, and Swagger UI's ``url: '...'`` option
REFERENCE = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")


def _references(html: str) -> list[str]:
    return [a or b for a, b in REFERENCE.findall(html)]


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("/docs", {"/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css"}),
        ("/redoc", {"/docs-assets/redoc.standalone.js"}),
    ],
)
def test_docs_pages_reference_only_assets_this_server_serves(
    client: TestClient, page: str, expected: set[str]
) -> None:
    answer = client.get(page)
    assert answer.status_code == 200
    assert re.search(r"https?://", answer.text) is None, answer.text  # no CDN, no Google font
    references = _references(answer.text)
    assert expected | {"/docs-assets/favicon.png", "/openapi.json"} <= set(references)
    for url in references:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 0, url


def test_swagger_ui_asks_no_online_validator(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text


def test_swagger_ui_oauth2_redirect_page_is_served(client: TestClient) -> None:
    answer = client.get("/docs/oauth2-redirect")
    assert answer.status_code == 200 and "oauth2" in answer.text.lower()


def test_docs_assets_are_not_in_the_openapi_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith(("/docs", "/redoc"))]
