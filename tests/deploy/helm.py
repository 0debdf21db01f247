"""The real ``helm`` (scripts/ensure-helm.sh) on the chart in deploy/helm/fleetwatch.

A missing helm is a skip naming the script, or a failure where FLEETWATCH_REQUIRE_HELM=1.
Renders are cached for the session by their arguments: a values file must not change once
rendered (write another).
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = [
    "CHART",
    "HELM_VERSION",
    "REPO",
    "SCENARIOS",
    "helm",
    "kubectl_render_args",
    "render",
    "render_objects",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "fleetwatch"
HELM_VERSION = "v3.11.3"
KUBE_VERSION = "1.30.0"
MONITORING_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)

# name -> (values files relative to the repository, API versions the cluster serves)
SCENARIOS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "postgresql": (("deploy/helm/fleetwatch/ci/postgresql-values.yaml",), ()),
    "postgresql+operator": (("deploy/helm/fleetwatch/ci/postgresql-values.yaml",), MONITORING_APIS),
    "all-on": (("deploy/helm/fleetwatch/ci/all-on-values.yaml",), MONITORING_APIS),
    "sqlite-kmsg": (("deploy/helm/fleetwatch/ci/sqlite-kmsg-values.yaml",), ()),
    "kubectl": (("deploy/kubernetes/values.yaml",), ()),
    "1000-nodes": (("deploy/helm/fleetwatch/examples/fleet-1000-nodes.yaml",), MONITORING_APIS),
}


@cache
def _helm_path() -> str | None:
    explicit = os.environ.get("FLEETWATCH_HELM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = subprocess.run(
        [str(REPO / "scripts" / "ensure-helm.sh")], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or None if found.returncode == 0 else None


def helm() -> str:
    path = _helm_path()
    if path is None:
        message = (
            f"helm {HELM_VERSION} not found and not buildable here: run scripts/ensure-helm.sh "
            "(it needs Go and the Go module proxy) or set FLEETWATCH_HELM"
        )
        if os.environ.get("FLEETWATCH_REQUIRE_HELM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def kubectl_render_args() -> list[str]:
    """The arguments deploy/kubernetes/*.yaml were rendered with (after `helm template`)."""
    return [
        "fleetwatch",
        str(CHART.relative_to(REPO)),
        "--namespace",
        "fleetwatch",
        "-f",
        "deploy/kubernetes/values.yaml",
        "--kube-version",
        KUBE_VERSION,
    ]


@cache
def render(
    values: tuple[str, ...] = (),
    api_versions: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    release: str = "fleetwatch",
    namespace: str = "fleetwatch",
) -> str:
    """``helm template`` output (values files relative to the repository, or absolute); a render
    error fails the test with helm's message."""
    command = [helm(), "template", release, str(CHART), "--namespace", namespace]
    command += ["--kube-version", KUBE_VERSION]
    for path in values:
        command += ["-f", str(REPO / path)]
    for api in api_versions:
        command += ["--api-versions", api]
    command += list(extra)
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode != 0:
        pytest.fail(f"helm template failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def render_objects(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render(*args, **kwargs)) if doc]
