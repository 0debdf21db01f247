"""``/runbooks/<name>``: the runbook pages (``docs/runbooks``), served by the server itself.

An alert's ``runbook_url`` must open on an air-gapped cluster at 3 a.m., so the pages come from
this server, not from a docs site on the internet. They go out as the Markdown they are written
in, as plain text: every browser shows it, and it stays readable without a renderer. No token:
the pages hold procedures, not fleet data (like ``/docs``).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from fleetwatch.runbooks import page_text

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


def _page(name: str) -> PlainTextResponse:
    text = page_text(name.removesuffix(".md"))
    if text is None:
        return PlainTextResponse(f"no runbook page {name!r}; see /runbooks/\n", status_code=404)
    return PlainTextResponse(text)


@router.get("/runbooks", summary="The runbook index")
@router.get("/runbooks/", summary="The runbook index")
def runbook_index() -> PlainTextResponse:
    return _page("index")


@router.get("/runbooks/{name}", summary="One runbook page")
def runbook(name: str) -> PlainTextResponse:
    return _page(name)
