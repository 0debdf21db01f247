"""The alert rules: promtool accepts them, their unit tests pass, and every alert is tested
both firing and not firing, with a severity and annotations."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import require_tool

from fleetwatch.metrics import GPU_METRICS

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "dashboards/prometheus/rules"
RULES = RULES_DIR / "fleetwatch.rules.yml"
RULE_TESTS = RULES_DIR / "fleetwatch.rules.test.yml"
SOURCES = REPO / "src/fleetwatch"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def exported_metric_names() -> set[str]:
    """Every ``fleetwatch_*`` family the server can put on /metrics, read from its sources."""
    names = {m.name for m in GPU_METRICS}
    for path in (
        SOURCES / "metrics.py",
        SOURCES / "server/runtime/metric_families.py",
        *SOURCES.glob("server/metrics/*exposition.py"),
    ):
        names |= set(re.findall(r"\b(fleetwatch_[a-z0-9_]+?)(?:\{|\"| )", path.read_text()))
    return names


def test_promtool_check_rules_accepts_the_rules() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_severity_annotations_and_a_for_duration() -> None:
    for rule in _alerts():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert rule.get("for"), f"{rule['alert']} fires on a single evaluation"
        assert rule["alert"].startswith("FleetWatch")


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in _alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"


@pytest.mark.parametrize("rule", _alerts(), ids=lambda r: r["alert"])
def test_alert_expressions_use_only_exported_metrics(rule: dict[str, Any]) -> None:
    used = set(re.findall(r"\bfleetwatch_[a-z0-9_]+", rule["expr"]))
    assert used - exported_metric_names() == set()


def test_prometheus_config_loads_the_rules_and_alertmanager() -> None:
    config = yaml.safe_load((REPO / "dashboards/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["rules/fleetwatch.rules.yml"]
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager:9093"]
