"""Which runbook page answers which alert, and where that page is.

Every page is ``docs/runbooks/<name>.md``: one per Prometheus alert rule (its ``alert:`` name)
and one per FleetWatch alert kind (the ``kind`` of an ``alerts`` row; the network-port rules of
kind ``host`` have a page of their own, ``ports``, since on-call does different things for a
cable than for a machine check). The server serves the pages at ``/runbooks/<name>``
(:mod:`fleetwatch.server.runbook_pages`), so a link works on an air-gapped install;
``runbook_base_url`` points links elsewhere (a docs site). ``docs/runbooks/index.md`` says why.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_BASE_URL", "page_text", "runbook_page", "runbook_url"]

DEFAULT_BASE_URL = "/runbooks"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# Alert kinds whose page is not named after the kind: the webhook test delivery has no runbook
# beyond the index.
_PAGE_OF_KIND = {"test": "index"}


def runbook_page(kind: str, rule: str | None = None) -> str:
    """The page name (no ``.md``) for an alert of ``kind`` made by ``rule``."""
    if kind == "host" and rule is not None and rule.startswith("port_"):
        return "ports"
    page = _PAGE_OF_KIND.get(kind, kind)
    return page if _NAME.fullmatch(page) else "index"


def runbook_url(base_url: str, kind: str, rule: str | None = None) -> str:
    """The link an alert of ``kind`` (and ``rule``) carries: ``<base_url>/<page>``."""
    return f"{base_url.rstrip('/')}/{runbook_page(kind, rule)}"


def _pages_dir() -> Path:
    """The packaged copy of ``docs/runbooks`` (the wheel's ``fleetwatch/runbook_pages``), else
    the checkout's own (a source tree or an editable install, where the wheel's copy is not)."""
    packaged = Path(str(resources.files("fleetwatch"))) / "runbook_pages"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def page_text(name: str) -> str | None:
    """The Markdown of page ``name`` (``index`` for the index), or None when there is none."""
    if not _NAME.fullmatch(name):
        return None
    path = _pages_dir() / f"{name}.md"
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
