"""Every alert has a runbook: each Prometheus alert rule and each alert kind the server raises has
its page in docs/runbooks with the five sections, every rule carries its runbook_url, and what
the pages point at (other pages, Grafana panels) exists."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest
import yaml

from fleetwatch.runbooks import page_text, runbook_page, runbook_url
from fleetwatch.server.concepts.verdict import Verdict
from fleetwatch.server.tell import conditions

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs/runbooks"
RULES = REPO / "dashboards/prometheus/rules/fleetwatch.rules.yml"
DASHBOARDS = REPO / "dashboards/grafana/dashboards"
SECTIONS = (
    "## What it means",
    "## Evidence",
    "## Do now",
    "## Reset, drain, diagnose or RMA",
    "## False alarm?",
)
# The base the shipped rules link to (docs/runbooks/index.md: one base to replace elsewhere).
RULES_BASE = "http://localhost:8400/runbooks"
# A panel named on a page: **FleetWatch / <dashboard> → <panel>** (may wrap across lines).
PANEL = re.compile(r"\*\*(FleetWatch\s+/\s+[^*→]+?)\s+→\s+([^*]+?)\*\*")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _condition_kinds() -> set[str]:
    """The ``kind`` of every ``Condition(...)`` that conditions.py builds, read from its source:
    the second positional argument or ``kind=``, a string or a module constant."""
    tree = ast.parse(Path(conditions.__file__).read_text())
    kinds: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Condition"):
            continue
        args = [kw.value for kw in node.keywords if kw.arg == "kind"] or node.args[1:2]
        for arg in args:
            # ``a if cond else b``: both branches are kinds.
            for value in [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]:
                if isinstance(value, ast.Constant):
                    kinds.add(str(value.value))
                elif isinstance(value, ast.Name) and value.id.isupper():
                    kinds.add(getattr(conditions, value.id))
                # Anything else (v.kind) is a verdict's kind: from Verdict's annotation below.
    return kinds


def alert_kinds() -> set[str]:
    """Every alert kind the server can raise: the fleet and node conditions' own kinds, and the
    kinds of the verdicts that become GPU and node alerts."""
    verdict_kinds = set(get_args(get_type_hints(Verdict)["kind"]))
    return _condition_kinds() | verdict_kinds


def _port_rules() -> set[str]:
    """The rule names port_health.py gives its verdicts: the first argument of each call to its
    verdict maker (``_verdict("port_down", ...)``)."""
    from fleetwatch.rules import port_health

    tree = ast.parse(Path(port_health.__file__).read_text())
    return {
        str(node.args[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "_verdict"
        and isinstance(node.args[0], ast.Constant)
    }


def _pages() -> list[Path]:
    return sorted(PAGES.glob("*.md"))


def _panels() -> set[tuple[str, str]]:
    found = set()
    for path in DASHBOARDS.glob("*.json"):
        board = json.loads(path.read_text())
        stack = list(board.get("panels", []))
        while stack:
            panel = stack.pop()
            stack.extend(panel.get("panels", []))
            found.add((board["title"], panel.get("title", "")))
    return found


def test_alert_kinds_are_read_from_the_code() -> None:
    kinds = alert_kinds()
    # The derivation must see both sources: the verdicts' kinds and the conditions' own.
    assert {"xid", "health", "host"} <= kinds
    assert {"unreachable", "straggler", "drain_budget", "fleet_silence"} <= kinds
    assert conditions.UNREADABLE_KIND in kinds
    assert len(kinds) >= 10, kinds


@pytest.mark.parametrize("kind", sorted(alert_kinds()))
def test_every_alert_kind_has_a_runbook_page(kind: str) -> None:
    page = runbook_page(kind)
    assert page == kind, f"alert kind {kind!r} links to {page!r}, not its own page"
    assert (PAGES / f"{kind}.md").is_file(), f"write docs/runbooks/{kind}.md"


def test_port_rules_have_the_ports_page() -> None:
    rules = _port_rules()
    assert {"port_down", "port_flap", "port_degraded", "port_errors"} <= rules, rules
    for rule in rules:
        assert runbook_page("host", rule) == "ports"
    assert runbook_page("host", "sxid_fatal") == "host"
    assert (PAGES / "ports.md").is_file()


@pytest.mark.parametrize("alert", [r["alert"] for r in _alert_rules()])
def test_every_prometheus_alert_has_a_page_and_its_runbook_url(alert: str) -> None:
    assert (PAGES / f"{alert}.md").is_file(), f"write docs/runbooks/{alert}.md"
    [rule] = [r for r in _alert_rules() if r["alert"] == alert]
    assert rule["annotations"].get("runbook_url") == f"{RULES_BASE}/{alert}"


@pytest.mark.parametrize("path", _pages(), ids=lambda p: p.name)
def test_every_page_opens_with_its_title_and_has_the_sections(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# "), f"{path.name}: the first line must be its h1 title"
    assert len(re.findall(r"^# ", text, flags=re.M)) == 1, f"{path.name}: one h1"
    if path.name == "index.md":
        return
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == list(SECTIONS), f"{path.name}: sections {headings}"
    for section in re.split(r"^## .*$", text, flags=re.M)[1:]:
        assert section.strip(), f"{path.name}: an empty section"


@pytest.mark.parametrize("path", _pages(), ids=lambda p: p.name)
def test_page_links_and_panels_exist(path: Path) -> None:
    text = path.read_text()
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        assert (path.parent / target).resolve().is_file(), f"{path.name}: broken link {target}"
    panels = _panels()
    for board, panel in PANEL.findall(text):
        named = (re.sub(r"\s+", " ", board), re.sub(r"\s+", " ", panel))
        assert named in panels, f"{path.name}: no Grafana panel {named}"


def test_index_lists_every_page() -> None:
    index = (PAGES / "index.md").read_text()
    linked = set(LINK.findall(index))
    missing = {p.name for p in _pages() if p.name != "index.md"} - linked
    assert not missing, f"docs/runbooks/index.md does not link {sorted(missing)}"


def test_runbook_url_joins_the_base_and_the_page() -> None:
    assert runbook_url("/runbooks", "xid", "xid79_off_bus") == "/runbooks/xid"
    assert runbook_url("https://fw.example/runbooks/", "host", "port_down") == (
        "https://fw.example/runbooks/ports"
    )
    assert runbook_url("/runbooks", "test") == "/runbooks/index"
    assert runbook_url("/runbooks", "../../etc/passwd") == "/runbooks/index"


def test_page_text_reads_pages_and_refuses_other_names() -> None:
    assert (page_text("xid") or "").startswith("# Xid verdict")
    assert page_text("no_such_page") is None
    assert page_text("../README") is None
