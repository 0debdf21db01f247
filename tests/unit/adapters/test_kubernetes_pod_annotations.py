"""``k8s-sync --annotate-pods`` (issue 15, opt-in): before cordoning a node, its running pods get
``fleetwatch.io/drain-pending``, through the official client against the fake API server of
test_kubernetes_sync.py, extended with pods (``GET /api/v1/pods?fieldSelector=`` and ``PATCH
/api/v1/namespaces/{ns}/pods/{name}``, JSON merge patch). Without the flag no pod is touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from click.testing import CliRunner
from tests.fake_scheduler_api import FakeSchedulerApi
from tests.unit.adapters import test_kubernetes_sync as base
from tests.unit.adapters.test_kubernetes_sync import (
    MERGE_PATCH,
    FakeKubeApi,
    merge_patch,
    serve_kube,
    sync,
)

from fleetwatch.adapters.job_signals import POD_ANNOTATION

kubeconfig = base.kubeconfig  # the fixture, over this file's kube


class FakeKubeWithPods(FakeKubeApi):
    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}

    def add_pod(self, namespace: str, name: str, node: str, phase: str = "Running") -> None:
        self.pods[(namespace, name)] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": {}},
            "spec": {"nodeName": node}, "status": {"phase": phase},
        }  # fmt: skip

    def handle_full(self, method: str, url: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        parts = urlsplit(url)
        if parts.path == "/api/v1/pods" and method == "GET":
            self.requests.append({"method": method, "path": url, "content_type": ctype})
            wanted = dict(
                term.split("=", 1)
                for term in parse_qs(parts.query).get("fieldSelector", [""])[0].split(",")
                if term
            )
            items = [
                p for p in self.pods.values()
                if wanted.get("spec.nodeName", p["spec"]["nodeName"]) == p["spec"]["nodeName"]
                and wanted.get("status.phase", p["status"]["phase"]) == p["status"]["phase"]
            ]  # fmt: skip
            return 200, {"kind": "PodList", "apiVersion": "v1", "items": items}
        if parts.path.startswith("/api/v1/namespaces/") and "/pods/" in parts.path:
            self.requests.append(
                {"method": method, "path": parts.path, "content_type": ctype, "body": body}
            )
            _, _, _, _, namespace, _, name = parts.path.split("/")
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, {"kind": "Status", "code": 404, "message": "pod not found"}
            if method == "PATCH" and ctype == MERGE_PATCH:
                self.pods[(namespace, name)] = merge_patch(pod, body)
                return 200, self.pods[(namespace, name)]
            return 415, {"kind": "Status", "code": 415, "message": "unsupported"}
        return self.handle(method, parts.path, ctype, body)


@pytest.fixture
def kube() -> Iterator[FakeKubeWithPods]:
    fake = FakeKubeWithPods()
    with serve_kube(fake.handle_full) as url:
        fake.url = url
        yield fake


def test_annotate_pods_marks_the_running_pods_before_the_cordon(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeWithPods, kubeconfig: Path
) -> None:
    kube.add("node-a")
    kube.add("node-b")
    kube.add_pod("train", "llm-0", "node-a")
    kube.add_pod("train", "llm-done", "node-a", phase="Succeeded")
    kube.add_pod("train", "llm-1", "node-b")
    api.add("node-a", reason="xid 79: GPU fell off the bus")
    result = sync(runner, api, kubeconfig, "--annotate-pods")
    assert result.exit_code == 0, result.output
    annotated = {k: p["metadata"]["annotations"] for k, p in kube.pods.items()}
    assert annotated == {
        ("train", "llm-0"): {POD_ANNOTATION: "1: xid 79: GPU fell off the bus"},
        ("train", "llm-done"): {},
        ("train", "llm-1"): {},
    }
    order = [(r["method"], urlsplit(r["path"]).path) for r in kube.requests]
    pod_patch = order.index(("PATCH", "/api/v1/namespaces/train/pods/llm-0"))
    assert pod_patch < order.index(("PATCH", "/api/v1/nodes/node-a"))  # before the cordon
    assert kube.nodes["node-a"]["spec"]["unschedulable"] is True


def test_without_the_flag_no_pod_is_read_or_touched(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeWithPods, kubeconfig: Path
) -> None:
    kube.add("node-a")
    kube.add_pod("train", "llm-0", "node-a")
    api.add("node-a")
    result = sync(runner, api, kubeconfig)
    assert result.exit_code == 0, result.output
    assert not any("pods" in r["path"] for r in kube.requests)
    assert kube.pods[("train", "llm-0")]["metadata"]["annotations"] == {}
