"""``/docs`` (Swagger UI) and ``/redoc`` served with their assets from this server, not a CDN.

FastAPI's own pages load Swagger UI, ReDoc, a Google font and the favicon from the internet, so
on an air-gapped cluster they render blank. The same pages here point at the copies that the
``fastapi-offline`` package ships, mounted under ``/docs-assets``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "add_offline_docs"]

ASSETS_URL = "/docs-assets"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def _assets_dir() -> Path:
    import fastapi_offline  # the server extra installs it; imported here to name it in one place

    return Path(fastapi_offline.__file__).parent / "static"


def add_offline_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Add the two documentation pages and their assets to ``app`` (built with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")

    def here(request: Request, path: str) -> str:
        return f"{request.scope.get('root_path', '')}{path}"

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=here(request, app.openapi_url or "/openapi.json"),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=here(request, OAUTH2_REDIRECT_URL),
            swagger_js_url=here(request, f"{ASSETS_URL}/swagger-ui-bundle.js"),
            swagger_css_url=here(request, f"{ASSETS_URL}/swagger-ui.css"),
            swagger_favicon_url=here(request, f"{ASSETS_URL}/favicon.png"),
            # No validator badge: it is an image fetched from validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None, **(app.swagger_ui_parameters or {})},
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=here(request, app.openapi_url or "/openapi.json"),
            title=f"{app.title} - ReDoc",
            redoc_js_url=here(request, f"{ASSETS_URL}/redoc.standalone.js"),
            redoc_favicon_url=here(request, f"{ASSETS_URL}/favicon.png"),
            with_google_fonts=False,  # the fonts come from Google; the system's serve instead
        )
