"""The Helm chart's rendered containers, run here as processes, make a working fleet.

``helm template`` renders the chart for PostgreSQL with the agent (dcgm-exporter and the kernel
log file), k8s-sync (annotating pods, maintenance windows) and the Prometheus Operator's
objects. Then, each with exactly its rendered arguments and environment (tests/integration/
kubelet.py: what stands in for a node, and why): the migration Job, two api and two worker
pods on a fresh PostgreSQL database, an agent on node gpu-node-1 and k8s-sync against a fake
Kubernetes API server. A wrong flag, environment name, Secret key, mount path, port or Service
name passes every schema but not this.

Fakes, as nothing real can run here: the Kubernetes API server (tests/unit/adapters'
``FakeKubeWithPods``, over TLS, refusing what the rendered ClusterRole does not grant and any
token but the pod's service account's) and dcgm-exporter (a captured page of a real one,
shared/fixtures/dcgm_exporter, served on the node's address; its last-Xid field is changed to
79 to fail a GPU). Everything FleetWatch is real.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import ssl
import threading
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from fleetwatch.adapters.job_signals import POD_ANNOTATION
from fleetwatch.adapters.kubernetes import TAINT_KEY
from tests.certs import Authority
from tests.conftest import throwaway_postgres
from tests.deploy.helm import MONITORING_APIS, render_objects
from tests.faults.waiting import wait_for
from tests.integration.kubelet import Node, Pod, Process, ServiceProxy, loopback
from tests.integration.live import create_token
from tests.unit.adapters.test_kubernetes_pod_annotations import FakeKubeWithPods

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

NODE = "gpu-node-1"
FAILING_GPU = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"  # the captured page's first T4
SERVICE_ACCOUNT_TOKEN = "sa-token-k8s-sync"


def _tls_pair(directory: Path, address: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for ``address`` (what a cluster's API server presents), as
    the service account's ca.crt and the API server's pair."""
    authority = Authority("fake-cluster")
    ca = directory / "ca.crt"
    ca.write_bytes(authority.cert_pem)
    cert, key = authority.issue("kube-apiserver", ips=(address,)).write(directory, "apiserver")
    return ca, cert, key


def _request_permission(method: str, path: str) -> tuple[str, str]:
    """(verb, resource) of a core API request, as the API server's authorizer names them."""
    parts = urlsplit(path).path.strip("/").split("/")  # api v1 [namespaces ns] resource [name]
    if len(parts) >= 4 and parts[2] == "namespaces":
        parts = parts[:2] + parts[4:]
    resource, named = parts[2], len(parts) > 3
    verb = {"GET": "get" if named else "list", "PATCH": "patch"}.get(method, method.lower())
    return verb, resource


@contextlib.contextmanager
def fake_kube_api(
    fake: FakeKubeWithPods,
    address: str,
    tls: tuple[Path, Path, Path],
    granted: set[tuple[str, str]],
) -> Iterator[list[tuple[str, str]]]:
    """The fake API server over HTTPS on ``address``:6443, answering only the service account's
    token and only what ``granted`` (verb, resource) allows: 401 and 403 otherwise, as RBAC
    would. Yields the (verb, resource) of each request it answered."""
    used: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: Any) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or token != SERVICE_ACCOUNT_TOKEN:
                return self._answer(401, {"kind": "Status", "code": 401})
            permission = _request_permission(self.command, self.path)
            if permission not in granted:
                return self._answer(
                    403, {"kind": "Status", "code": 403, "message": str(permission)}
                )
            used.append(permission)
            self._answer(
                *fake.handle_full(self.command, self.path, self.headers["Content-Type"], body)
            )

        do_GET = do_PATCH = _serve

    server = ThreadingHTTPServer((address, 6443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[1], tls[2])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield used
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def fake_dcgm_exporter(address: str, page: Callable[[], str]) -> Iterator[None]:
    """dcgm-exporter's /metrics on the node's address, port 9400 (what agent.dcgmUrl names)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            payload = page().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer((address, 9400), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _workload(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def _ready(url: str) -> dict[str, Any] | None:
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.TransportError:
        return None
    return dict(answer.json()) if answer.status_code == 200 else None


def test_the_rendered_fleet_runs_and_cordons_a_failing_node(
    tmp_path: Path, shared_dir: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the service account token goes in a mount namespace: unshare needs root")
    captured = (
        shared_dir / "fixtures/dcgm_exporter/metrics/datadog__dcgm_tests_fixtures_metrics.txt"
    ).read_text()
    xid_series = next(
        line for line in captured.splitlines()
        if line.startswith("DCGM_FI_DEV_XID_ERRORS{") and FAILING_GPU in line
    )  # fmt: skip
    dcgm_page = {"text": captured}
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(throwaway_postgres())
        values = {
            "database": {"type": "postgresql", "url": database_url},
            "settings": {
                "assess_interval_s": 0.5, "planner_interval_s": 0.5, "refit_interval_s": 0,
            },
            "rules": "[health]\ntemp_margin_c = 3.0\n",
            "log": {"level": "info", "format": "text"},
        }  # fmt: skip
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        objects = render_objects((str(values_file),), MONITORING_APIS)

        node = Node(NODE, loopback(101), tmp_path / "nodes" / NODE)
        (node.root / "var/log").mkdir(parents=True)
        kern_log = node.root / "var/log/kern.log"
        kern_log.write_text("")
        service_ip = loopback(2)
        service = _workload(objects, "Service", "fleetwatch")
        services = {f"{service['metadata']['name']}.fleetwatch.svc": service_ip}
        processes: list[Process] = []

        def pod(name: str, host: int, rendered: list[dict[str, Any]], **extra: Any) -> Pod:
            root = tmp_path / "pods" / name
            root.mkdir(parents=True)
            return Pod(name, loopback(host), node, root, rendered, services, **extra)

        def start(p: Pod, workload: dict[str, Any]) -> Process:
            spec = workload["spec"]["template"]["spec"]
            (container,) = spec["containers"]
            process = stack.enter_context(p.run(spec, container))
            processes.append(process)
            return process

        def logs() -> str:
            return "\n".join(p.tail() for p in processes)

        def alive() -> None:
            """Fail at once, with the logs, when a long-running process has exited."""
            for p in processes[1:]:  # the first is the migration Job, which exits
                if p.process.poll() is not None:
                    raise AssertionError(f"{p.pod} exited ({p.process.returncode})\n{logs()}")

        def waiting(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
            def probe() -> Any:
                alive()
                return check()

            return wait_for(what, probe, timeout)

        try:
            # 1. The pre-install hook: `fleetwatch db upgrade` on the empty database.
            job = _workload(objects, "Job", "-migrate")
            migrate = start(pod("migrate", 5, objects), job)
            assert migrate.process.wait(timeout=300) == 0, logs()

            # 2. Tokens, as NOTES.txt has the operator make them; then the release with them.
            tokens = {
                scope: create_token(database_url, scope, f"chart-{scope}")
                for scope in ("agent", "read", "scheduler")
            }
            values["secrets"] = {f"{s}Token": t for s, t in tokens.items()}
            values["agent"] = {
                "enabled": True, "collectors": ["dcgm-exporter", "kernel-log"], "interval": 1,
                "pushInterval": 0, "labels": {"rack": "r1"},
            }  # fmt: skip
            values["k8sSync"] = {
                "enabled": True,
                "interval": 1,
                "annotatePods": True,
                "maintenance": True,
            }
            release_file = tmp_path / "values-release.yaml"  # renders are cached by path
            release_file.write_text(yaml.safe_dump(values))
            objects = render_objects((str(release_file),), MONITORING_APIS)

            # 3. Two api and two worker pods.
            api, worker = (
                _workload(objects, "Deployment", "-api"),
                _workload(objects, "Deployment", "-worker"),
            )
            assert api["spec"]["replicas"] == 2 and worker["spec"]["replicas"] == 2
            container_port = api["spec"]["template"]["spec"]["containers"][0]["ports"][0][
                "containerPort"
            ]
            readiness = api["spec"]["template"]["spec"]["containers"][0]["readinessProbe"][
                "httpGet"
            ]["path"]
            servers = {}
            for i, (workload, role) in enumerate(
                [(api, "api"), (api, "api"), (worker, "worker"), (worker, "worker")]
            ):
                p = pod(f"{role}-{i}", 11 + i, objects)
                start(p, workload)
                servers[p.name] = f"http://{p.ip}:{container_port}"
            answers = {
                name: waiting(f"{name} ready", lambda u=url: _ready(u + readiness), timeout=180)
                for name, url in servers.items()
            }
            assert {a["role"] for n, a in answers.items() if n.startswith("api")} == {"api"}
            leaders = waiting(
                "one worker leading",
                lambda: [
                    n
                    for n in servers
                    if n.startswith("worker")
                    and (_ready(servers[n] + readiness) or {}).get("leader")
                ],
            )
            assert len(leaders) == 1, logs()  # one leads, the other stands by
            assert not any(
                (_ready(servers[n] + readiness) or {}).get("leader")
                for n in servers
                if n.startswith("api")
            )

            # 4. The Service in front of the api pods.
            (port,) = service["spec"]["ports"]
            proxy = ServiceProxy(
                service_ip,
                port["port"],
                [
                    (servers[n].split("//")[1].split(":")[0], container_port)
                    for n in servers
                    if n.startswith("api")
                ],
            )
            stack.callback(proxy.close)

            # 5. The fake API server with the node and a job's pod on it; k8s-sync in-cluster.
            fake = FakeKubeWithPods()
            fake.add(NODE)
            fake.add_pod("train", "llm-0", NODE)
            (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
            granted = {
                (verb, resource)
                for rule in role["rules"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            }
            api_ip = loopback(3)
            sa_dir = tmp_path / "serviceaccount"
            sa_dir.mkdir()
            tls = _tls_pair(sa_dir, api_ip)
            (sa_dir / "token").write_text(SERVICE_ACCOUNT_TOKEN)
            (sa_dir / "namespace").write_text("fleetwatch")
            used = stack.enter_context(fake_kube_api(fake, api_ip, tls, granted))
            stack.enter_context(fake_dcgm_exporter(node.ip, lambda: dcgm_page["text"]))
            sync = _workload(objects, "Deployment", "-k8s-sync")
            start(pod("k8s-sync", 30, objects, kube_api=(api_ip, 6443, sa_dir)), sync)

            # 6. The agent on gpu-node-1, reading dcgm-exporter and the kernel log file.
            agent = _workload(objects, "DaemonSet", "-agent")
            start(pod(f"agent-{NODE}", 40, objects), agent)
            read = httpx.Client(
                base_url=f"http://{service_ip}:{port['port']}",
                headers={"Authorization": f"Bearer {tokens['read']}"},
                timeout=10,
            )
            stack.callback(read.close)
            gpus = waiting(
                "the agent's GPUs stored",
                lambda: read.get("/v1/gpus", params={"node": NODE}).json(),
                timeout=120,
            )
            assert FAILING_GPU in {g["uuid"] for g in gpus}, logs()

            # The kernel log file on the node reaches the server as an event.
            stamp = dt.datetime.now().strftime("%b %e %H:%M:%S")
            with kern_log.open("a") as log:
                log.write(
                    f"{stamp} {NODE} kernel: [ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 13, "
                    "pid=4242, name=python, Graphics Exception: ESR 0x5\n"
                )
            waiting(
                "the kernel log's Xid 13 stored",
                lambda: any(
                    e.get("xid") == 13
                    for e in read.get("/v1/events", params={"node": NODE, "kind": "xid"}).json()[
                        "data"
                    ]
                ),
                timeout=120,
            )

            # 7. The GPU fails (dcgm-exporter's last Xid becomes 79): the node is cordoned and
            # tainted, its pod annotated first, through exactly the granted permissions.
            dcgm_page["text"] = captured.replace(xid_series, xid_series.rsplit(" ", 1)[0] + " 79")
            cordoned = waiting(
                "the node cordoned by k8s-sync",
                lambda: fake.nodes[NODE]["spec"].get("unschedulable") and fake.nodes[NODE],
                timeout=180,
            )
            assert any(t["key"] == TAINT_KEY for t in cordoned["spec"]["taints"]), logs()
            annotation = fake.pods[("train", "llm-0")]["metadata"]["annotations"][POD_ANNOTATION]
            eviction_id = re.match(r"^(\d+): ", annotation)  # '<eviction id>: <reason>'
            assert eviction_id, annotation
            with httpx.Client(
                base_url=f"http://{service_ip}:{port['port']}",
                headers={"Authorization": f"Bearer {tokens['scheduler']}"},
                timeout=10,
            ) as scheduler:
                eviction = scheduler.get(f"/v1/evictions/{eviction_id.group(1)}").json()
            assert eviction["node"] == NODE, eviction
            assert [g["uuid"] for g in eviction["evidence"]["gpus"]] == [FAILING_GPU], eviction
            # The maintenance sync lists nodes on its own passes (every --interval): the drain
            # above may come first.
            with contextlib.suppress(AssertionError):
                waiting(
                    "k8s-sync to use every granted permission",
                    lambda: set(used) == granted,
                    timeout=60,
                )
            assert set(used) == granted, f"granted but never used: {granted - set(used)}"
            assert all(c > 0 for c in proxy.connections), proxy.connections  # both api pods served

            # 8. Prometheus' view: the ServiceMonitor's endpoints, with its read token; the
            # node is on the default page and on its shard's (crc32(name) % shards).
            monitor = _workload(objects, "ServiceMonitor", "fleetwatch")
            default, *shard_endpoints = monitor["spec"]["endpoints"]
            page = read.get(default["path"]).text
            assert f'fleetwatch_node_up{{node="{NODE}"' in page, page[:2000]
            shards = int(shard_endpoints[0]["params"]["shards"][0])
            (mine,) = [
                e for e in shard_endpoints
                if int(e["params"]["shard"][0]) == zlib.crc32(NODE.encode()) % shards
            ]  # fmt: skip
            params = {key: value[0] for key, value in mine["params"].items()}
            shard_page = read.get(mine["path"], params=params).text
            assert FAILING_GPU in shard_page and mine["relabelings"][0]["replacement"] == (
                "fleetwatch-shards"
            )
        except BaseException:
            print(logs())  # noqa: T201 - the processes' logs, for the failure's reader
            raise


def test_the_default_values_run_one_sqlite_pod(tmp_path: Path) -> None:
    """`helm install` with no values: one pod, `server --role all` on SQLite in its volume,
    migrating its own file; it becomes ready and leads."""
    objects = render_objects()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    node = Node(NODE, loopback(102), tmp_path / "node")
    node.root.mkdir()
    root = tmp_path / "pod"
    root.mkdir()
    pod = Pod("fleetwatch-0", loopback(50), node, root, objects)
    port = container["ports"][0]["containerPort"]
    path = container["readinessProbe"]["httpGet"]["path"]
    with pod.run(spec, container) as process:

        def ready() -> dict[str, Any] | None:
            assert process.process.poll() is None, process.tail()
            return _ready(f"http://{pod.ip}:{port}{path}")

        answer = wait_for("the SQLite pod ready", ready, timeout=120)
    assert answer["role"] == "all" and answer["leader"] is True, answer
    assert list((root / "volumes" / "data").glob("*.db")), "the database is in the data volume"
