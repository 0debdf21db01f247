"""The MkDocs hooks in scripts/mkdocs/: links of pages from outside docs/, the runbooks' navigation,
the REST API reference rendered from an OpenAPI document, and the strictness of mkdocs.yml."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"docs_hook_{name}", REPO / f"scripts/mkdocs/{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


repo_pages = _hook("repo_pages")
runbooks_nav = _hook("runbooks_nav")
rest_api = _hook("rest_api_reference")


def test_repo_pages_sources_exist() -> None:
    missing = [source for source in repo_pages.PAGES if not (REPO / source).is_file()]
    assert missing == []


@pytest.mark.parametrize(
    ("source", "target", "dest", "expected"),
    [
        ("README.md", "docs/agent.md", "index.md", "agent.md"),
        ("README.md", "docs/deploying.md#the-image", "index.md", "deploying.md#the-image"),
        ("README.md", "docs/images/fleet-page.png", "index.md", "images/fleet-page.png"),
        ("README.md", "deploy/helm/fleetwatch/README.md", "index.md", "helm-chart.md"),
        ("benchmarks/HISTORY.md", "../BENCHMARKS.md", "benchmarks-history.md", "benchmarks.md"),
        ("docs/operations.md", "../BENCHMARKS.md#tls", "operations.md", "benchmarks.md#tls"),
        ("docs/runbooks/ports.md", "../../BENCHMARKS.md", "runbooks/ports.md", "../benchmarks.md"),
        (
            "docs/runbooks/ports.md",
            "../operations.md#tls",
            "runbooks/ports.md",
            "../operations.md#tls",
        ),
        # Left alone: a web address, an anchor, and a repository file that is no page (so that
        # --strict reports it).
        ("README.md", "https://example.com/x.md", "index.md", "https://example.com/x.md"),
        ("docs/agent.md", "#mig-enabled-gpus", "agent.md", "#mig-enabled-gpus"),
        (
            "docs/agent.md",
            "../src/fleetwatch/cli/__init__.py",
            "agent.md",
            "../src/fleetwatch/cli/__init__.py",
        ),
    ],
)
def test_repo_pages_link_points_at_the_page_in_the_site(
    source: str, target: str, dest: str, expected: str
) -> None:
    assert repo_pages.site_target(source, target, dest) == expected


def test_repo_pages_rewrite_keeps_link_titles_and_text() -> None:
    markdown = 'See [the chart](deploy/helm/fleetwatch/README.md "Helm") and `docs/x.md`.'
    assert repo_pages.rewrite_links(markdown, "README.md", "index.md") == (
        'See [the chart](helm-chart.md "Helm") and `docs/x.md`.'
    )


def test_runbooks_nav_lists_index_first_then_pages_by_name(tmp_path: Path) -> None:
    (tmp_path / "runbooks").mkdir()
    for name in ("ports.md", "index.md", "fatal_xid.md", "notes.txt"):
        (tmp_path / "runbooks" / name).write_text("# x\n")
    pages = runbooks_nav.runbook_pages(tmp_path)
    assert pages == ["runbooks/index.md", "runbooks/fatal_xid.md", "runbooks/ports.md"]
    nav = [
        {"Home": "index.md"},
        {"Operations": [{"Ops": "operations.md"}, {"Runbooks": "runbooks/"}]},
    ]
    assert runbooks_nav.expand(nav, pages) == [
        {"Home": "index.md"},
        {"Operations": [{"Ops": "operations.md"}, {"Runbooks": pages}]},
    ]


def test_runbooks_nav_drops_the_section_without_pages(tmp_path: Path) -> None:
    assert runbooks_nav.runbook_pages(tmp_path) == []
    assert runbooks_nav.expand([{"Runbooks": "runbooks/"}, "x.md"], []) == ["x.md"]


SPEC = {
    "info": {"version": "1", "description": "Needs `Authorization: Bearer <token>` or <none>."},
    "paths": {
        "/v1/things/{name}": {
            "get": {
                "tags": ["things"],
                "summary": "Read one thing",
                "security": [{"HTTPBearer": []}],
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "default": 10},
                        "description": "At most | this many",
                    },
                ],
                "responses": {
                    "404": {"description": "No such thing"},
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}
                        },
                    },
                },
            }
        },
        "/healthz": {"get": {"tags": ["health"], "responses": {"200": {"description": "up"}}}},
    },
    "components": {
        "schemas": {
            "Thing": {
                "properties": {
                    "tags": {"type": "array", "items": {"$ref": "#/components/schemas/Tag"}},
                    "state": {"anyOf": [{"enum": ["up", "down"]}, {"type": "null"}]},
                },
                "required": ["tags"],
            },
            "Tag": {"type": "string"},
        }
    },
}


def test_rest_api_reference_renders_operations_parameters_and_schemas() -> None:
    page = rest_api.render(SPEC)
    lines = page.splitlines()
    assert "### `GET /v1/things/{name}`" in lines
    assert "Authentication: bearer token." in lines and "Authentication: none." in lines
    assert "| `name` | path | string | yes |   |" in lines
    # A cell's pipe is escaped; limits and default follow the description.
    assert "| `limit` | query | integer | no | At most \\| this many; ≥ 1, default `10` |" in lines
    # Responses in status order, the body linked to its schema's anchor.
    ok = lines.index("| 200 | OK | `application/json` [Thing](#schema-thing) |")
    assert ok < lines.index("| 404 | No such thing |   |")
    assert "### Thing { #schema-thing }" in lines and "### Tag { #schema-tag }" in lines
    assert "| `tags` | array of [Tag](#schema-tag) | yes |   |" in lines
    assert '| `state` | one of `"up"`, `"down"` or null | no |   |' in lines
    # `<` outside code would start an HTML tag; inside a code span it is shown as written.
    assert "Needs `Authorization: Bearer <token>` or &lt;none&gt;." in lines


def test_rest_api_reference_of_the_app_links_only_schemas_it_defines() -> None:
    import re

    spec = rest_api.app_openapi()
    page = rest_api.render(spec)
    linked = set(re.findall(r"\]\(#(schema-[a-z0-9-]+)\)", page))
    defined = set(re.findall(r"\{ #(schema-[a-z0-9-]+) \}", page))
    assert linked and linked <= defined
    for path in spec["paths"]:
        assert f" {path}`" in page


def test_mkdocs_config_fails_the_build_on_broken_links_and_anchors() -> None:
    from mkdocs.config import load_config

    config = load_config(str(REPO / "mkdocs.yml"))
    assert config.strict is True
    links = config.validation.links
    assert links.not_found == links.anchors == links.unrecognized_links == logging.WARNING
    assert config.validation.nav.omitted_files == logging.WARNING
    assert config.theme["font"] is False  # no Google Fonts
    assert "offline" not in config.plugins  # it adds a script from unpkg.com
