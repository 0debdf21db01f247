"""The container image, run by podman: a server container on its embedded SQLite, an agent
container pushing a simulated node to it, and a fatal Xid in that node's kernel log becomes a
pending eviction.

Real: podman (Debian's, rootful) and the image `make image` archives, built by
scripts/build-image.sh from the repository's Dockerfile on the Debian base it makes with
mmdebstrap; the image's own entrypoint and default command (the server on 0.0.0.0, as uid 10001,
its SQLite file in the working directory), with a read-only root filesystem; the agent in a
second container from the same image, pushing over HTTPS (the server serves TLS with a
certificate made in the test, the agent verifies it with `--ca-bundle`; the image's health check
probes over HTTPS too); tokens made by `fleetwatch token create` inside the server's container.
Simulated: the GPUs (the agent's `sim` collector reports a node of a `fleetwatch sim init`
fleet) and the kernel log (a file the test appends the Xid line to, which the agent's kernel-log
collector follows instead of /dev/kmsg). Networking is podman's default bridge: the agent
reaches the server at its container address, port 8400, by the name its certificate carries
(`--add-host`), and the test at a free loopback port published to it.

Cost: the first run on a machine makes the Debian base (minutes; cached in
~/.cache/fleetwatch/image) and the Python dependencies' layer (podman's layer cache); later runs
rebuild only the layers of a changed source, or nothing.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetwatch.sim.spec import FleetSpec
from tests.certs import Authority
from tests.conftest import require_tool
from tests.dockerfile import REPO, read_dockerfile
from tests.faults.waiting import wait_for
from tests.integration.live import fleetwatch, free_port, log_xid79, stop_process, wait_ready

pytestmark = pytest.mark.slow

BUILD_TIMEOUT_S = 1800  # a first build on a machine makes the Debian base


@pytest.fixture
def image() -> str:
    """The image ID scripts/build-image.sh builds from this checkout."""
    for tool in ("podman", "runc", "mmdebstrap"):
        require_tool(tool)
    if os.geteuid() != 0:
        pytest.skip("the image test runs rootful podman and mmdebstrap: run it as root")
    build = subprocess.run(
        [str(REPO / "scripts/build-image.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stderr[-5000:]
    return build.stdout.split()[-1]


def podman(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout


def runtime_options() -> list[str]:
    """What podman needs here to start a container, as scripts/build-image.sh gives its build:
    runc (crun 1.8 refuses a cgroup v1 host whose cgroup2 hierarchy holds a controller), and
    limits no higher than this process's own (podman asks for 1,048,576 open files, which needs
    CAP_SYS_RESOURCE above the hard limit)."""
    limits = []
    for name, limit, cap in (("nofile", resource.RLIMIT_NOFILE, 1 << 20),
                             ("nproc", resource.RLIMIT_NPROC, 32768)):  # fmt: skip
        hard = resource.getrlimit(limit)[1]
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        limits += ["--ulimit", f"{name}={value}:{value}"]
    return ["--runtime", "runc", *limits]


def start_container(
    stack: ExitStack, name: str, image: str, log: Path, options: list[str], args: list[str]
) -> subprocess.Popen[bytes]:
    """``podman run`` in the foreground, its output in ``log``: SIGTERM to it stops the
    container (podman passes the signal on); removed on the way out in any case."""
    with log.open("ab") as sink:
        process = subprocess.Popen(
            ["podman", "run", "--rm", "--name", name, "--read-only", *runtime_options(),
             *options, image, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    stack.callback(subprocess.run, ["podman", "rm", "--force", "--time", "0", name],
                   capture_output=True, timeout=120)  # fmt: skip
    stack.callback(stop_process, process)
    return process


def inside(container: str) -> dict[str, Any]:
    """Who and what runs in ``container``: uid, gid, Python, Debian suite, installed packages."""
    probe = (
        "import json, os, sys; from importlib import metadata; "
        "release = dict(l.strip().split('=', 1) for l in open('/etc/os-release') if '=' in l); "
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'python': sys.version_info[:2], "
        "'suite': release['VERSION_CODENAME'], 'prefix': sys.prefix, "
        "'dists': [d.metadata['Name'] for d in metadata.distributions()]}))"
    )
    return dict(json.loads(podman("exec", container, "python", "-c", probe)))


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted_distributions(extras: str) -> set[str]:
    """The distributions the Dockerfile's requirements step installs for ``extras``."""
    listed = subprocess.run(
        [sys.executable, str(REPO / "deploy/image/requirements.py"), str(REPO / "pyproject.toml"),
         extras],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {_normalised(re.split(r"[\[<>=!~;]", requirement)[0]) for requirement in listed}


@pytest.fixture
def names() -> Iterator[str]:
    yield f"fleetwatch-it-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}-{secrets.token_hex(3)}"


def assert_configured_as_declared(image: str) -> None:
    """What the Helm chart and compose rely on, as the Dockerfile declares it: uid 10001,
    `fleetwatch` as entrypoint, the server on 0.0.0.0:8400 as default command, the health
    check, the data directory."""
    [inspected] = json.loads(podman("image", "inspect", image))
    config = {**inspected["Config"], "Healthcheck": inspected.get("Healthcheck")}
    declared = read_dockerfile().config
    assert {key: config.get(key) for key in declared} == declared
    assert declared["User"] == "10001:10001" and declared["Entrypoint"] == ["fleetwatch"]
    assert declared["Cmd"] == ["server", "--host", "0.0.0.0"]
    assert declared["ExposedPorts"] == {"8400/tcp": {}}


def test_image_server_and_agent_containers_turn_a_fatal_xid_into_an_eviction(
    image: str, names: str, tmp_path: Path
) -> None:
    """One test, not several: on a machine's first run the build takes a minute or two, and a
    second test on another pytest-xdist worker would wait that long for the build's lock."""
    assert_configured_as_declared(image)
    shared = tmp_path / "shared"  # mounted read-only into the agent's container
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    fleetwatch("sim", "init", "--nodes", "1", "--gpus", "2", "--out", str(shared / "sim"))
    node = FleetSpec.load(shared / "sim/fleet.json").node_name(0)
    kernel_log = shared / "kern.log"
    kernel_log.write_text("")
    # HTTPS end to end, with certificates made here: the server's names are the host the agent
    # is told (mapped to the server container's address) and the published loopback port.
    authority = Authority("image-test")
    ca = authority.write(shared, "fleetwatch")
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o755)
    cert, key = authority.issue(
        "fleetwatch-server", dns=("fleetwatch-server",), ips=("127.0.0.1",)
    ).write(tls, "server")
    for made_file in (ca, cert, key):
        made_file.chmod(0o644)  # the image's user (10001) reads them through the mount
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=str(ca))
    server_log, agent_log = tmp_path / "server.log", tmp_path / "agent.log"
    dockerfile = read_dockerfile()
    with ExitStack() as stack:
        # No arguments: the image's own command, `fleetwatch server --host 0.0.0.0`.
        server = start_container(stack, f"{names}-server", image, server_log, [
            "--publish", f"127.0.0.1:{port}:8400",
            "--volume", f"{tls}:/tls:ro",
            "--env", f"FLEETWATCH_SERVER_TLS_CERT=/tls/{cert.name}",
            "--env", f"FLEETWATCH_SERVER_TLS_KEY=/tls/{key.name}",
            # The judge and the planner on short timers, the model refit off (as in
            # test_evictions_live.py): the Xid becomes an eviction within a second or two.
            "--env", "FLEETWATCH_SERVER_ASSESS_INTERVAL_S=0.5",
            "--env", "FLEETWATCH_SERVER_PLANNER_INTERVAL_S=0.5",
            "--env", "FLEETWATCH_SERVER_REFIT_INTERVAL_S=0",
            # The working directory, where the default SQLite file goes, on a tmpfs of its own
            # (owned by the image's user, as a volume with an fsGroup would be).
            "--mount", "type=tmpfs,destination=/var/lib/fleetwatch,tmpfs-mode=0750,chown=true",
        ], [])  # fmt: skip
        ready = wait_ready(url, server, server_log, timeout=180, verify=verify)
        assert ready["status"] == "ready", ready
        # The image's HEALTHCHECK, run once by hand (podman schedules it with systemd timers).
        podman("healthcheck", "run", f"{names}-server")

        found = inside(f"{names}-server")
        assert (found["uid"], found["gid"]) == (10001, 10001)
        assert found["suite"] == dockerfile.debian_suite and found["prefix"] == "/opt/fleetwatch"
        assert tuple(found["python"]) >= (3, 11)
        missing = wanted_distributions(dockerfile.args["EXTRAS"]) - {
            _normalised(name) for name in found["dists"]
        }
        assert not missing, f"the image lacks {sorted(missing)} of {dockerfile.args['EXTRAS']}"

        made = podman(
            "exec", f"{names}-server", "sh", "-c",
            "fleetwatch token create --scope agent --name image-agent | tail -n 1 && "
            "fleetwatch token create --scope scheduler --name image-sched | tail -n 1",
        )  # fmt: skip
        agent_token, scheduler_token = made.split()
        (shared / "agent.token").write_text(agent_token + "\n")
        address = podman("inspect", "--format", "{{.NetworkSettings.IPAddress}}",
                         f"{names}-server").strip()  # fmt: skip
        assert address, "the server container has no address on podman's network"

        start_container(stack, f"{names}-agent", image, agent_log, [
            "--volume", f"{shared}:/shared:ro",
            "--add-host", f"fleetwatch-server:{address}",
        ], [
            "agent", "--server-url", "https://fleetwatch-server:8400",
            "--ca-bundle", f"/shared/{ca.name}",
            "--token-file", "/shared/agent.token", "--node-name", node,
            "--collectors", "sim,kernel-log",
            "--sim-spec", "/shared/sim/fleet.json", "--kernel-log", "/shared/kern.log",
            "--interval", "1", "--push-interval", "0", "--spool-dir", "/tmp/spool",
        ])  # fmt: skip
        with httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {scheduler_token}"},
            timeout=10,
            verify=verify,
        ) as sched:

            def gpus() -> list[dict[str, Any]]:
                answer = sched.get(f"/v1/nodes/{node}")
                return list(answer.json().get("gpus", [])) if answer.status_code == 200 else []

            def pending() -> list[dict[str, Any]]:
                answer = sched.get("/v1/evictions", params={"state": "pending"})
                return list(answer.json()["data"])

            reported = wait_for(f"the agent container's GPUs of {node} on the server", gpus)
            assert len(reported) == 2, reported
            assert pending() == []
            log_xid79(kernel_log, str(reported[-1]["pci_bus_id"]))
            [eviction] = wait_for("a pending eviction", pending)
        assert eviction["node"] == node and eviction["reason_kind"] == "rule", eviction
        assert eviction["evidence"]["gpus"][0]["uuid"] == reported[-1]["uuid"], eviction
    assert server.returncode == 0, server_log.read_text()[-3000:]
    for log in (server_log, agent_log):
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
