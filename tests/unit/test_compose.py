"""docker-compose.yml: the whole stack (server, PostgreSQL, Prometheus, Alertmanager, Grafana,
simulated agents), every mounted file present, and the mounted configs accepted by their tools."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def _bind_mounts(compose: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(service, repo-relative source, container target) of every ./ bind mount."""
    mounts = []
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                mounts.append((name, source, target))
    return mounts


def test_compose_validates_against_the_compose_spec(
    compose: dict[str, Any], shared_dir: Path
) -> None:
    schema = json.loads((shared_dir / "reference/compose-spec/compose-spec.json").read_text())
    # The spec is draft-07 (its README says so); name the validator rather than guess from $schema.
    jsonschema.Draft7Validator(schema).validate(compose)


def test_compose_runs_the_whole_monitoring_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "server", "prometheus", "alertmanager", "grafana"} <= set(services)
    agents = [s for name, s in services.items() if name.startswith("sim-agent")]
    assert len(agents) >= 3
    nodes = set()
    for agent in agents:
        args = agent["command"]
        assert args[0] == "agent" and "--collectors=sim" in args
        nodes.add(next(a for a in args if a.startswith("--node-name=")))
    assert len(nodes) == len(agents), "two simulated agents claim one node"
    assert "build" in agents[0]


def test_compose_builds_what_exists_and_serves_from_postgres(compose: dict[str, Any]) -> None:
    """(Its mounted files: test_every_mounted_file_exists.)"""
    services = compose["services"]
    assert isinstance(services, dict)
    assert {"postgres", "migrate", "server", "prometheus"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            assert (REPO / service["build"] / "Dockerfile").is_file(), name
    server_env = services["server"]["environment"]
    assert server_env["FLEETWATCH_SERVER_DATABASE_URL"].startswith("postgresql://")


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    mounts = _bind_mounts(compose)
    assert mounts
    for service, source, _target in mounts:
        assert (REPO / source).exists(), f"{service}: {source}"


def test_prometheus_mounts_its_config_and_rules(compose: dict[str, Any]) -> None:
    targets = {t: s for name, s, t in _bind_mounts(compose) if name == "prometheus"}
    assert targets["/etc/prometheus/prometheus.yml"] == "./dashboards/prometheus/prometheus.yml"
    assert targets["/etc/prometheus/rules"] == "./dashboards/prometheus/rules"
    grafana = {t: s for name, s, t in _bind_mounts(compose) if name == "grafana"}
    assert grafana["/etc/grafana/provisioning"] == "./dashboards/grafana/provisioning"
    provider = yaml.safe_load(
        (REPO / "dashboards/grafana/provisioning/dashboards/fleetwatch.yml").read_text()
    )["providers"][0]
    assert grafana[provider["options"]["path"]] == "./dashboards/grafana/dashboards"


def test_promtool_accepts_the_mounted_prometheus_config(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    promtool = require_tool("promtool")
    # Lay the mounts out as the container sees them; the token is written by the init service.
    etc = tmp_path / "etc/prometheus"
    for name, source, target in _bind_mounts(compose):
        if name == "prometheus":
            destination = tmp_path / target.lstrip("/")
            destination.parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if (REPO / source).is_dir() else shutil.copyfile
            copy(REPO / source, destination)
    (etc / "secrets").mkdir()
    (etc / "secrets/prometheus.token").write_text("fwt_placeholder\n")
    result = subprocess.run(
        [promtool, "check", "config", str(etc / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_config() -> None:
    amtool = require_tool("amtool")
    result = subprocess.run(
        [amtool, "check-config", str(REPO / "dashboards/alertmanager/alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
