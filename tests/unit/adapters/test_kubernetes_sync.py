"""``fleetwatch k8s-sync`` through the official ``kubernetes`` client against a fake API server.

No real Kubernetes API server can run here, so ``FakeKubeApi`` is a small HTTP server in the test
that serves ``GET /api/v1/nodes``, ``GET /api/v1/nodes/{name}`` and ``PATCH /api/v1/nodes/{name}``
(JSON merge patch, RFC 7386, with a ``resourceVersion`` check) and records every request exactly:
the tests assert method, path, Content-Type and body. The CLI reaches it through a kubeconfig
file, as it would a real cluster. The scheduler API is ``tests/fake_scheduler_api.py``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient
from tests.fake_scheduler_api import FakeSchedulerApi
from tests.faults.waiting import wait_for
from tests.unit.adapters.conftest import sync_loop

from fleetwatch.adapters.client import SchedulerClient
from fleetwatch.adapters.kubernetes import (
    EVICTION_ANNOTATION,
    MAINTENANCE_ANNOTATION,
    TAINT_KEY,
    KubernetesBackend,
    core_api,
    taint_value,
)
from fleetwatch.adapters.sync import SyncEngine
from fleetwatch.cli import main

MERGE_PATCH = "application/merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKubeApi:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    def add(self, name: str, **spec: Any) -> None:
        annotations = spec.pop("annotations", {})
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations},
            "spec": spec,
        }

    def patches(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "PATCH"]

    def handle(self, method: str, path: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        self.requests.append({"method": method, "path": path, "content_type": ctype, "body": body})
        if method == "GET" and path == "/api/v1/nodes":
            return 200, {"kind": "NodeList", "apiVersion": "v1", "items": list(self.nodes.values())}
        name = path.removeprefix("/api/v1/nodes/")
        node = self.nodes.get(name)
        if node is None or "/" in name:
            return 404, {"kind": "Status", "message": f"nodes {name!r} not found", "code": 404}
        if method == "GET":
            return 200, node
        if method == "PATCH" and ctype == MERGE_PATCH:
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != node["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "message": "object was modified", "code": 409}
            patched = merge_patch(copy.deepcopy(node), body)
            patched["metadata"]["resourceVersion"] = str(int(wanted or 0) + 1)
            self.nodes[name] = patched
            return 200, patched
        return 415, {"kind": "Status", "message": f"unsupported {method} {ctype}", "code": 415}


Handle = Callable[[str, str, str | None, Any], tuple[int, Any]]


@contextlib.contextmanager
def serve_kube(handle: Handle) -> Iterator[str]:
    """Serve ``handle(method, path with query, content type, JSON body)`` over HTTP on loopback
    (the fake API server's wire); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, answer = handle(self.command, self.path, self.headers["Content-Type"], body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PATCH = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi()

    def handle(method: str, path: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        return fake.handle(method, path.split("?", 1)[0], ctype, body)

    with serve_kube(handle) as url:
        fake.url = url
        yield fake


@pytest.fixture
def kubeconfig(tmp_path: Path, kube: FakeKubeApi) -> Path:
    path = tmp_path / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
        "users": [{"name": "fake", "user": {"token": "kube-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))
    return path


def sync(runner: CliRunner, api: FakeSchedulerApi, kubeconfig: Path, *extra: str) -> Result:
    args = ["k8s-sync", "--server", api.url, "--token", "sched-token", "--once"]
    return runner.invoke(main, [*args, "--kubeconfig", str(kubeconfig), *extra])


def test_taint_value_is_a_valid_label_value() -> None:
    assert taint_value("risk") == "risk"
    assert taint_value("xid 79: fell/off") == "xid-79-fell-off"
    assert taint_value("-" + "a" * 80) == "a" * 63
    assert taint_value("§§") == "unhealthy"


def test_k8s_sync_cordons_taints_and_annotates_then_completes(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    other_taint = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    kube.add("node-a", taints=[other_taint])
    eviction = api.add("node-a", reason_kind="straggler job/step")
    result = sync(runner, api, kubeconfig)
    assert result.exit_code == 0, result.output
    [patch] = kube.patches()
    assert patch["path"] == "/api/v1/nodes/node-a"
    assert patch["content_type"] == MERGE_PATCH
    assert patch["body"] == {
        "metadata": {"annotations": {EVICTION_ANNOTATION: "1"}, "resourceVersion": "1"},
        "spec": {
            "unschedulable": True,
            "taints": [
                other_taint,
                {"key": TAINT_KEY, "value": "straggler-job-step", "effect": "NoSchedule"},
            ],
        },
    }
    assert eviction["state"] == "completed"
    # Read to decide, read again for the resourceVersion the patch names, patch, then list.
    assert [(r["method"], r["path"]) for r in kube.requests] == [
        ("GET", "/api/v1/nodes/node-a"),
        ("GET", "/api/v1/nodes/node-a"),
        ("PATCH", "/api/v1/nodes/node-a"),
        ("GET", "/api/v1/nodes"),
    ]


def test_k8s_sync_never_touches_a_node_cordoned_by_someone_else(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    kube.add("node-b", unschedulable=True)
    eviction = api.add("node-b")
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert kube.patches() == []
    assert eviction["state"] == "rejected"
    assert eviction["detail"].startswith("already drained by someone else: cordoned by someone")


def test_k8s_sync_rejects_a_node_the_cluster_does_not_have(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    eviction = api.add("node-z")
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert eviction["state"] == "rejected" and "not known to kubernetes" in eviction["detail"]


def test_k8s_sync_rejects_when_the_node_changed_under_it(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    kube.add("node-a")
    eviction = api.add("node-a")
    original = kube.handle

    def bump_version(method: str, path: str, ctype: str | None, body: Any) -> tuple[int, Any]:
        if method == "PATCH":  # someone else wrote the node after we read it
            kube.nodes["node-a"]["metadata"]["resourceVersion"] = "7"
        return original(method, path, ctype, body)

    kube.handle = bump_version  # type: ignore[method-assign]
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert eviction["state"] == "rejected" and "HTTP 409" in eviction["detail"]
    assert "unschedulable" not in kube.nodes["node-a"]["spec"]


def test_k8s_sync_returned_removes_only_its_own_taint_and_uncordons(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    other_taint = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    ours = {"key": TAINT_KEY, "value": "rule", "effect": "NoSchedule"}
    marks = {"annotations": {EVICTION_ANNOTATION: "1"}}
    kube.add("node-a", unschedulable=True, taints=[other_taint, ours], **marks)
    kube.add("node-b", unschedulable=True)  # cordoned by someone else
    api.add("node-a", state="returned")
    api.add("node-b", state="returned")
    assert sync(runner, api, kubeconfig).exit_code == 0
    [patch] = kube.patches()
    assert patch["path"] == "/api/v1/nodes/node-a" and patch["content_type"] == MERGE_PATCH
    assert patch["body"] == {
        "metadata": {"annotations": {EVICTION_ANNOTATION: None}, "resourceVersion": "1"},
        "spec": {"unschedulable": None, "taints": [other_taint]},
    }
    assert kube.nodes["node-a"]["spec"] == {"taints": [other_taint]}
    assert kube.nodes["node-b"]["spec"] == {"unschedulable": True}


def test_k8s_sync_loop_cordons_and_uncordons_at_once_not_on_its_interval(
    api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    """As the Slurm loop test: a 60 s interval, each change waited for at most 20 s."""
    kube.add("node-a")
    client = SchedulerClient.connect(api.url, "sched-token")
    engine = SyncEngine(client, KubernetesBackend(core_api(str(kubeconfig))))
    with sync_loop(engine, api, interval_s=60.0):
        wait_for("the first long-poll", lambda: api.waiting, timeout=20)
        eviction = api.add("node-a")
        wait_for("node-a cordoned", lambda: eviction["state"] == "completed", timeout=20)
        assert kube.nodes["node-a"]["spec"]["unschedulable"] is True
        wait_for("the long-poll after the cordon", lambda: api.waiting, timeout=20)
        returned = httpx.post(
            f"{api.url}/v1/nodes/node-a/return",
            json={"note": "repaired"},
            headers={"Authorization": "Bearer sched-token"},
        )
        assert returned.status_code == 200, returned.text
        wait_for("node-a uncordoned", lambda: kube.nodes["node-a"]["spec"] == {}, timeout=20)
    client.close()
    assert EVICTION_ANNOTATION not in kube.nodes["node-a"]["metadata"]["annotations"]


def test_k8s_sync_operator_uncordon_returns_the_node_then_cleans_up(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    ours = {"key": TAINT_KEY, "value": "rule", "effect": "NoSchedule"}
    kube.add("node-a", taints=[ours], annotations={EVICTION_ANNOTATION: "1"})  # uncordoned
    eviction = api.add("node-a", state="completed")
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert eviction["state"] == "returned"
    assert [c[1] for c in api.changes()] == ["/v1/nodes/node-a/return"]
    assert sync(runner, api, kubeconfig).exit_code == 0  # the next pass clears our marks
    assert kube.nodes["node-a"]["spec"] == {}
    assert kube.nodes["node-a"]["metadata"]["annotations"] == {}


def test_k8s_sync_cordons_again_a_node_uncordoned_before_it_passed_validation(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    ours = {"key": TAINT_KEY, "value": "rule", "effect": "NoSchedule"}
    kube.add("node-a", taints=[ours], annotations={EVICTION_ANNOTATION: "1"})  # uncordoned
    eviction = api.add("node-a", state="completed")
    api.unvalidated["node-a"] = "node node-a has no validation newer than the eviction"
    result = sync(runner, api, kubeconfig)
    assert result.exit_code == 0, result.output
    assert eviction["state"] == "completed"
    assert kube.nodes["node-a"]["spec"]["unschedulable"] is True  # out of service again
    assert [t["key"] for t in kube.nodes["node-a"]["spec"]["taints"]] == [TAINT_KEY]
    # Validated: the operator's next uncordon is reported as a return.
    del api.unvalidated["node-a"]
    kube.nodes["node-a"]["spec"] = {"taints": [ours]}
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert eviction["state"] == "returned"


def test_k8s_sync_ignores_marks_of_another_eviction(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    kube.add("node-a", unschedulable=True, annotations={EVICTION_ANNOTATION: "2"})
    api.add("node-a", state="returned")  # id 1: an older eviction of the same node
    assert sync(runner, api, kubeconfig).exit_code == 0
    assert kube.patches() == [] and api.changes() == []


def test_k8s_sync_dry_run_patches_nothing(
    runner: CliRunner, api: FakeSchedulerApi, kube: FakeKubeApi, kubeconfig: Path
) -> None:
    kube.add("node-a")
    api.add("node-a")
    result = sync(runner, api, kubeconfig, "--dry-run")
    assert result.exit_code == 0, result.output
    assert kube.patches() == [] and api.changes() == []
    assert "would hold it and complete" in result.output


def test_k8s_sync_refuses_both_config_sources(
    runner: CliRunner, api: FakeSchedulerApi, kubeconfig: Path
) -> None:
    result = sync(runner, api, kubeconfig, "--in-cluster")
    assert result.exit_code == 2 and "exclude each other" in result.output


def test_k8s_sync_bad_kubeconfig_is_a_config_error(
    runner: CliRunner, api: FakeSchedulerApi, tmp_path: Path
) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    result = sync(runner, api, broken)
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: kubernetes config ({broken}): ")


def test_k8s_sync_keeps_a_window_for_each_node_annotated_for_maintenance(
    kube: FakeKubeApi, kubeconfig: Path, client: TestClient, tokens: dict[str, str]
) -> None:
    """Against a real FleetWatch app (TestClient is an httpx.Client): the annotation opens a
    window, a new value replaces it, its removal ends it; a person's window is left alone."""
    kube.add("node-a", annotations={MAINTENANCE_ANNOTATION: "swap PSU,\n ticket OPS-1"})
    kube.add("node-b")
    client.headers["Authorization"] = f"Bearer {tokens['scheduler']}"
    by_hand = client.post("/v1/maintenance", json={"nodes": ["node-b"], "reason": "by hand"})
    assert by_hand.status_code == 201, by_hand.text
    backend = KubernetesBackend(core_api(str(kubeconfig)))
    engine = SyncEngine(SchedulerClient(client), backend, maintenance=backend)

    def windows() -> list[dict[str, Any]]:
        found = client.get("/v1/maintenance", params={"key_prefix": "kubernetes:"}).json()
        return [w for w in found["data"] if w["state"] == "active"]

    report = engine.run_pass()
    assert report.windows_opened == ["kubernetes:node-a"] and not report.errors
    [window] = windows()
    assert window["nodes"] == ["node-a"] and window["reason"] == "swap PSU, ticket OPS-1"
    assert window["ends_at"] is None and window["created_by"] == "test-scheduler"
    assert client.get("/v1/nodes/node-a").status_code == 404  # no agent: a window all the same
    assert engine.run_pass().windows_opened == []  # nothing changed
    assert kube.patches() == []  # maintenance only reads the nodes

    kube.nodes["node-a"]["metadata"]["annotations"][MAINTENANCE_ANNOTATION] = "firmware"
    report = engine.run_pass()
    assert report.windows_ended == report.windows_opened == ["kubernetes:node-a"]
    assert [w["reason"] for w in windows()] == ["firmware"]

    del kube.nodes["node-a"]["metadata"]["annotations"][MAINTENANCE_ANNOTATION]
    assert engine.run_pass().windows_ended == ["kubernetes:node-a"]
    assert windows() == []
    kept = client.get(f"/v1/maintenance/{by_hand.json()['id']}").json()
    assert kept["state"] == "active"
