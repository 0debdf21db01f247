"""MkDocs hook: pages whose Markdown lives outside docs/, built into the site from that one copy.

The README is the site's home page, BENCHMARKS.md and benchmarks/HISTORY.md the benchmark
results, CONTRIBUTING.md and the Helm chart's README their own pages: each is written once, where
GitHub readers find it, and this hook adds it to the site at build time instead of a copy that
would drift. Their links are relative to where they live in the repository (``docs/agent.md``,
``../BENCHMARKS.md``), so the hook rewrites every link that points at one of these pages or into
docs/ to the page's place in the site; a link to anything else is left alone, and ``mkdocs build
--strict`` then fails on it as on any other broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# Repository path -> path in the site (relative to docs/).
PAGES = {
    "README.md": "index.md",
    "BENCHMARKS.md": "benchmarks.md",
    "benchmarks/HISTORY.md": "benchmarks-history.md",
    "CONTRIBUTING.md": "contributing.md",
    "deploy/helm/fleetwatch/README.md": "helm-chart.md",
}
DOCS = "docs/"
# The target of an inline link or image: `](target)` or `](target "title")`.
_LINK = re.compile(r"(\]\()([^)\s]+)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)", re.IGNORECASE)


def site_target(source: str, target: str, dest: str) -> str:
    """``target``, a link in the repository file ``source``, as a link from site page ``dest``."""
    if _EXTERNAL.match(target):
        return target
    path, hash_, fragment = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved in PAGES:
        in_site = PAGES[resolved]
    elif resolved.startswith(DOCS):
        in_site = resolved[len(DOCS) :]
    else:
        return target
    return posixpath.relpath(in_site, posixpath.dirname(dest) or ".") + hash_ + fragment


def rewrite_links(markdown: str, source: str, dest: str) -> str:
    """Every inline link of ``markdown`` (repository file ``source``) made relative to ``dest``."""
    return _LINK.sub(lambda m: m.group(1) + site_target(source, m.group(2), dest), markdown)


def _repo(config: Any) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    repo = _repo(config)
    for source, dest in PAGES.items():
        markdown = (repo / source).read_text(encoding="utf-8")
        files.append(File.generated(config, dest, content=rewrite_links(markdown, source, dest)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    # docs/ pages link to the pages above as ../BENCHMARKS.md and the like.
    if page.file.generated_by is not None:
        return markdown
    return rewrite_links(markdown, DOCS + page.file.src_uri, page.file.src_uri)


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    for source in PAGES:
        server.watch(str(_repo(config) / source))
    return server
