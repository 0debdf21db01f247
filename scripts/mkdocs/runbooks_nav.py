"""MkDocs hook: the Runbooks section of the navigation lists every page in docs/runbooks/.

mkdocs.yml names the section with a placeholder, ``Runbooks: runbooks/``, that only this hook
understands (a build without it fails: there is no page ``runbooks/``). The hook replaces it with
``runbooks/index.md`` first and then every other page by file name, so that a runbook added for a
new alert appears in the site without a second edit to mkdocs.yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLACEHOLDER = "runbooks/"


def runbook_pages(docs_dir: Path) -> list[str]:
    """``runbooks/index.md`` first, then the other pages sorted by name."""
    folder = docs_dir / PLACEHOLDER
    names = sorted(p.name for p in folder.glob("*.md")) if folder.is_dir() else []
    ordered = [n for n in names if n == "index.md"] + [n for n in names if n != "index.md"]
    return [PLACEHOLDER + name for name in ordered]


def expand(nav: list[Any], pages: list[str]) -> list[Any]:
    """``nav`` with each ``{title: "runbooks/"}`` made ``{title: pages}`` (dropped if none)."""
    out: list[Any] = []
    for item in nav:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == PLACEHOLDER:
                if pages:
                    out.append({title: list(pages)})
                continue
            if isinstance(value, list):
                item = {title: expand(value, pages)}
        out.append(item)
    return out


def on_config(config: Any) -> Any:
    if config.nav:
        config.nav = expand(config.nav, runbook_pages(Path(config.docs_dir)))
    return config
