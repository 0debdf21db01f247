"""Run a rendered pod's containers here as processes, as a kubelet would start them: the image's
entrypoint with the container's ``args`` (``$(VAR)`` expanded), the environment it declares
(values, Secret and ConfigMap keys, the downward API, ``envFrom``) and its volumes as folders.

No cluster runs here, so some things stand in for what a node gives a pod, each the least that
makes the rendered command run unchanged but for these substitutions:

- each pod and node has a loopback address of its own (127.<100 + worker>.0.x), standing for its
  IP: a listen address of 0.0.0.0 becomes the pod's address (in a pod, 0.0.0.0 is its own
  network namespace), and a Service's DNS name becomes the address of a small TCP proxy that
  spreads connections over the pods the Service selects;
- a volume's mount path becomes a folder of the pod's (hostPath: of the node's), and so does any
  argument or environment value naming a path under it;
- the image's entrypoint (the Dockerfile's ENTRYPOINT, ``fleetwatch``) is this tree's
  ``python -m fleetwatch``;
- the service account token of a pod that mounts one is put where the Kubernetes client looks
  for it (/var/run/secrets/kubernetes.io/serviceaccount) in a mount namespace of the process's
  own (``unshare``, root), with KUBERNETES_SERVICE_HOST/PORT naming the API server, as a kubelet
  sets them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def loopback(host: int) -> str:
    """This pytest worker's loopback address number ``host`` (1-254)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    return f"127.{100 + worker % 100}.0.{host}"


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined variable is replaced, $$ is a $, anything else
    stays as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(one, text)


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, which must be `fleetwatch`: this tree's `python -m fleetwatch`."""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            assert json.loads(line.removeprefix("ENTRYPOINT").strip()) == ["fleetwatch"], line
            return [sys.executable, "-m", "fleetwatch"]
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


@dataclass
class Node:
    name: str
    ip: str
    root: Path  # the node's filesystem: hostPath volumes land under it


@dataclass
class Pod:
    name: str
    ip: str
    node: Node
    root: Path
    objects: list[dict[str, Any]]  # the rendered release: Secrets and ConfigMaps are read here
    services: dict[str, str] = field(default_factory=dict)  # DNS name -> address standing for it
    kube_api: tuple[str, int, Path] | None = None  # host, port, service account folder

    def _secret(self, name: str) -> dict[str, str]:
        for obj in self.objects:
            if obj["kind"] == "Secret" and obj["metadata"]["name"] == name:
                found = dict(obj.get("stringData", {}))
                for key, value in obj.get("data", {}).items():
                    found[key] = base64.b64decode(value).decode()
                return found
        raise AssertionError(f"{self.name}: no Secret {name} in the release")

    def _config_map(self, name: str) -> dict[str, str]:
        for obj in self.objects:
            if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == name:
                return dict(obj.get("data", {}))
        raise AssertionError(f"{self.name}: no ConfigMap {name} in the release")

    def environment(self, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.kube_api is not None:
            env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = (
                self.kube_api[0],
                str(self.kube_api[1]),
            )
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                env.update(self._config_map(source["configMapRef"]["name"]))
            if "secretRef" in source:
                env.update(self._secret(source["secretRef"]["name"]))
        fields = {
            "metadata.name": self.name,
            "metadata.namespace": "fleetwatch",
            "spec.nodeName": self.node.name,
            "status.hostIP": self.node.ip,
            "status.podIP": self.ip,
        }
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = expand(item["value"], env)
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                values = self._secret(ref["name"])
                if ref["key"] in values:
                    env[item["name"]] = values[ref["key"]]
                else:
                    assert ref.get("optional"), f"{self.name}: Secret {ref} has no such key"
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[item["name"]] = self._config_map(ref["name"])[ref["key"]]
            else:
                raise AssertionError(f"{self.name}: cannot resolve {item}")
        return env

    def volumes(self, spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Path]:
        """Mount path -> the folder standing for it, filled as the kubelet fills it."""
        declared = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            volume = declared[mount["name"]]
            if "hostPath" in volume:
                where = self.node.root / volume["hostPath"]["path"].lstrip("/")
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    where.mkdir(parents=True, exist_ok=True)
                assert where.exists(), f"{self.name}: hostPath {where} is missing on the node"
            else:
                where = self.root / "volumes" / mount["name"]
                where.mkdir(parents=True, exist_ok=True)
                files: dict[str, str] = {}
                if "configMap" in volume:
                    data = self._config_map(volume["configMap"]["name"])
                    items = volume["configMap"].get("items") or [
                        {"key": k, "path": k} for k in data
                    ]
                    files = {i["path"]: data[i["key"]] for i in items}
                elif "secret" in volume:
                    files = self._secret(volume["secret"]["secretName"])
                for name, text in files.items():
                    (where / name).write_text(text)
            mounts[mount["mountPath"]] = where
        return mounts

    def command(
        self, spec: dict[str, Any], container: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        env = self.environment(container)
        args = [expand(a, env) for a in container.get("args", [])]
        mounts = self.volumes(spec, container)

        paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
        # A path stands alone, after a flag's '=' or as an SQLite URL's (sqlite:////var/...).
        under_mount = re.compile(rf"(?:(?<![\w/])|(?<=:///))({paths})(?=/|$)") if mounts else None

        def local(text: str) -> str:
            if under_mount is not None:  # one pass: a folder put in is not rewritten again
                text = under_mount.sub(lambda m: str(mounts[m.group(1)]), text)
            text = text.replace("=0.0.0.0", f"={self.ip}")
            for dns, address in self.services.items():
                text = re.sub(rf"(?<=//){re.escape(dns)}(?=:)", address, text)
            return text

        env = {k: local(v) for k, v in env.items()}
        env.update(
            PATH=os.environ["PATH"],
            PYTHONPATH=str(REPO / "src"),
            HOME=str(self.root),
            PYTHONDONTWRITEBYTECODE="1",
        )
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
        command = entrypoint() + [local(a) for a in args]
        if self.kube_api is not None and spec.get("automountServiceAccountToken", True):
            # The token where the client looks, in a mount namespace of this process only.
            run = os.path.realpath("/var/run")
            script = (
                f"mount -t tmpfs -o size=1m tmpfs {run} && mkdir -p {SA_PATH} && "
                f'mount --bind "$0" {SA_PATH} && exec "$@"'
            )
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                       str(self.kube_api[2]), *command]  # fmt: skip
        return command, env

    @contextmanager
    def run(self, spec: dict[str, Any], container: dict[str, Any]) -> Iterator[Process]:
        command, env = self.command(spec, container)
        log = self.root / f"{container['name']}.log"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=self.root
            )
        try:
            yield Process(self.name, process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Process:
    pod: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return f"--- {self.pod} ---\n" + self.log.read_text(errors="replace")[-4000:]


class ServiceProxy:
    """A Service's address: each connection goes to the next of the selected pods in turn."""

    def __init__(self, address: str, port: int, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self.connections = [0] * len(backends)
        self._listener = socket.create_server((address, port))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        turn = 0
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            index = turn % len(self.backends)
            turn += 1
            try:
                upstream = socket.create_connection(self.backends[index], timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections[index] += 1
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                thread.start()
                with self._lock:
                    self._threads.append(thread)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)
