"""The package's layers: pure logic never reaches up into the server, the server's own layers
import in one direction only, and no line is hand-packed.

``rules/``, ``models/``, ``reports/``, ``notify/`` and the modules beside them compute from what
they are given; only the server itself, the CLI, the demo and the migrations import
``fleetwatch.server``. Inside the server, :data:`SERVER_LAYERS` orders every package and module
from the web down to the pure concepts. Imports are read from each module's syntax tree, so an
import inside a function (or under ``TYPE_CHECKING``) counts as much as one at the top.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "fleetwatch"

# Parts that may import the server: the server itself and what starts or migrates it.
MAY_IMPORT_SERVER = ("server", "cli", "demo.py", "__main__.py", "migrations")

SERVER = PACKAGE / "server"
# The server's packages and modules, top to bottom: each imports its own layer and those below it,
# never one above. The stages are ordered among themselves too.
SERVER_LAYERS: tuple[tuple[str, ...], ...] = (
    # web: the app, its routes, page and schemas, and what serves a request or starts the process
    (
        "__init__",
        "access_log",
        "app",
        "auth",
        "client_certs",
        "csp",
        "deps",
        "docs",
        "errors",
        "fleet_pictures",
        "http_guard",
        "http_protocol",
        "log_config",
        "log_throttle",
        "malloc_arenas",
        "malloc_mmap",
        "mallopt",
        "node_binding",
        "node_page",
        "operations",
        "page",
        "process_tuning",
        "routers",
        "runbook_pages",
        "schemas",
        "timeparse",
        "tls",
        "token_cache",
    ),
    ("background",),  # the registry of background jobs: wires up and starts the stages below
    ("metrics",),  # stages: /metrics renders what the judge and the data layer know
    ("tell",),  # alerts, the webhook outbox, the weekly report's delivery
    ("act",),  # evictions and job notices, from the judge's verdicts
    ("judge",),  # the fleet's assessment: rule verdicts, risk, stragglers
    # hourly rollups (the judge's covariates), retention, lifetimes, refits; and history the CLI
    # imports from elsewhere (fleetwatch import prometheus) into the same rollups
    ("upkeep", "history"),
    ("ingest",),  # a push from the wire to the store
    ("repo",),  # data access: queries, returning rows, records and dataclasses
    ("runtime",),  # locks, leader, precedence, isolation, scheduler, leader state, metric families
    ("db",),  # tables, engine, the sample blocks' format, secrets at rest
    ("concepts",),  # pure: maintenance windows, liveness, ingest lag, verdicts
)


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _lower_layers() -> list[Path]:
    return [
        path
        for path in _modules(PACKAGE)
        if path.relative_to(PACKAGE).parts[0] not in MAY_IMPORT_SERVER
    ]


def _imported(path: Path, src: Path = SRC) -> set[str]:
    """Every module ``path`` imports, relative imports resolved against its package."""
    package = ".".join(path.relative_to(src).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_lower_layers_never_import_the_server() -> None:
    lower = _lower_layers()
    assert {p.relative_to(PACKAGE).parts[0] for p in lower} >= {
        "rules",
        "models",
        "reports",
        "notify",
        "agent",
        "client",
    }
    reaching_up = {
        str(path.relative_to(PACKAGE)): sorted(
            name for name in _imported(path) if name.split(".")[:2] == ["fleetwatch", "server"]
        )
        for path in lower
    }
    assert {path: names for path, names in reaching_up.items() if names} == {}


def _server_part(name: str) -> str | None:
    """The server package or module ``name`` (a dotted module path) lies in, or None."""
    parts = name.split(".")
    if parts[:2] != ["fleetwatch", "server"] or len(parts) < 3:
        return None
    return parts[2]


def test_every_server_part_has_a_layer() -> None:
    placed = [name for layer in SERVER_LAYERS for name in layer]
    assert len(placed) == len(set(placed))
    parts = {path.relative_to(SERVER).with_suffix("").parts[0] for path in _modules(SERVER)}
    assert parts == set(placed)


def test_server_imports_run_downward_only() -> None:
    rank = {name: depth for depth, layer in enumerate(SERVER_LAYERS) for name in layer}
    upward = {}
    for path in _modules(SERVER):
        here = path.relative_to(SERVER).with_suffix("").parts[0]
        above = sorted(
            name
            for name in _imported(path)
            if (part := _server_part(name)) is not None and rank[part] < rank[here]
        )
        if above:
            upward[str(path.relative_to(SERVER))] = above
    assert upward == {}


def test_import_resolution_sees_relative_and_nested_imports(tmp_path: Path) -> None:
    module = tmp_path / "fleetwatch" / "rules" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f():\n    from ..server import app\n", "utf-8")
    assert "fleetwatch.server.app" in _imported(module, src=tmp_path)


def test_pure_packages_import_without_the_server() -> None:
    code = (
        "import sys, fleetwatch.rules, fleetwatch.models, fleetwatch.reports, fleetwatch.notify;"
        "print(sorted(m for m in sys.modules if m.startswith('fleetwatch.server')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _fmt_skips(path: Path) -> int:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text("utf-8")).readline)
    return sum(
        1
        for token in tokens
        if token.type == tokenize.COMMENT
        and any(mark in token.string for mark in ("fmt: skip", "fmt: off"))
    )


def test_no_module_keeps_its_lines_from_the_formatter() -> None:
    packed = {
        str(path.relative_to(PACKAGE)): count
        for path in _modules(PACKAGE)
        if (count := _fmt_skips(path))
    }
    assert packed == {}


def test_fmt_skip_counting_reads_comments_only(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('x = "# fmt: skip"\ny = [1,  2]  # fmt: skip\n', "utf-8")
    assert _fmt_skips(module) == 1
