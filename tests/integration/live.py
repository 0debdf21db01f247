"""Real processes for integration tests: a `fleetwatch server` (uvicorn) on a free loopback port."""

from __future__ import annotations

import itertools
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

FLEETWATCH = [sys.executable, "-m", "fleetwatch"]


# Ports for the processes the tests start: below the kernel's ephemeral range (32768 and up by
# default), where no outgoing connection lands, and a block of its own per pytest-xdist worker,
# handed out in turn. A port the kernel picked (bind to 0) was free when asked, but another
# worker's server or any client connection could take it before the process bound it.
_PORT_BASE, _PORT_BLOCK, _PORT_BLOCKS = 20_000, 1_000, 12  # 20000-31999
_next_port = itertools.count()


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    base = _PORT_BASE + int(worker.removeprefix("gw") or 0) % _PORT_BLOCKS * _PORT_BLOCK
    for _ in range(_PORT_BLOCK):
        port = base + next(_next_port) % _PORT_BLOCK
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # still held (a process of an earlier test, a TIME_WAIT)
            return port
    raise RuntimeError(f"no free port in {base}-{base + _PORT_BLOCK - 1}")


def fleetwatch(*args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [*FLEETWATCH, *args],
        capture_output=True,
        text=True,
        timeout=300,  # a hung command still fails; a loaded 2-core CI must not
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"fleetwatch {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def create_token(database_url: str, scope: str, name: str | None = None) -> str:
    """A new token, made in this process as `fleetwatch token create` makes it (migrating an
    SQLite file first): a process of its own per token cost 1.5 s of CPU, and the suite makes
    a hundred. The command itself is tested in tests/unit/cli/test_cli.py."""
    from fleetwatch.config import ServerSettings
    from fleetwatch.server.auth import create_token as make_token
    from fleetwatch.server.db.migrate import prepare_database
    from fleetwatch.server.db.session import Database, make_engine

    settings = ServerSettings(database_url=database_url, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    try:
        prepare_database(db.engine, settings)
        with db.write() as conn:
            token, _ = make_token(conn, name=name or f"it-{scope}", scope=scope)
    finally:
        db.dispose()
    return token


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    verify: ssl.SSLContext | bool = True  # over HTTPS: the context that trusts its certificate

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
            verify=self.verify,
        )

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        return wait_ready(self.url, self.process, self.log, timeout, verify=self.verify)


@contextmanager
def live_server(
    database_url: str,
    log_dir: Path,
    *extra: str,
    port: int | None = None,
    verify: ssl.SSLContext | None = None,
    ready: bool = True,
) -> Iterator[LiveServer]:
    """A `fleetwatch server` with the flags ``extra``, ready; ``verify``: it serves HTTPS (its
    ``--tls-*`` flags are among ``extra``) and this context checks it (and presents a client
    certificate where it needs one). ``ready=False``: started, not waited for (the caller calls
    ``wait_ready``), so that several servers start side by side."""
    port = port or free_port()
    log = log_dir / f"server-{port}.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [*FLEETWATCH, "server", "--port", str(port), "--database-url", database_url, *extra],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    scheme = "https" if verify is not None else "http"
    server = LiveServer(f"{scheme}://127.0.0.1:{port}", process, log, verify or True)
    try:
        if ready:
            server.wait_ready()
        yield server
    finally:
        stop_process(process, timeout=10)


def log_xid79(kernel_log: Path, pci_bus_id: str) -> None:
    """Append to ``kernel_log`` (a file an agent's kernel-log collector follows) the kernel's
    Xid 79 line for the GPU at ``pci_bus_id``: it has fallen off the bus."""
    bus = pci_bus_id.rsplit(".", 1)[0]  # the kernel's spelling: no function number
    with kernel_log.open("a") as log:
        log.write(f"[ 1234.567890] NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', "
                  "name=<unknown>, GPU has fallen off the bus.\n")  # fmt: skip


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if the process is still there after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_ready(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 120.0,
    verify: ssl.SSLContext | bool = True,
) -> dict[str, Any]:
    """The server's ``/readyz`` answer once it is 200; fails with the server's ``log`` when the
    process exits first or is not ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early:\n{log.read_text()}")
        try:
            answer = httpx.get(f"{url}/readyz", timeout=2, verify=verify)
            if answer.status_code == 200:
                return dict(answer.json())
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"server not ready after {timeout}s:\n{log.read_text()}")


@dataclass
class AgentProcess:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    spool_dir: Path
    metrics_port: int

    def metric(self, name: str) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.TransportError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def stop(self) -> str:
        return stop_agents([self])[self.name]


def stop_agents(agents: list[AgentProcess], timeout: float = 20.0) -> dict[str, str]:
    """SIGTERM to every agent at once, then each waited for (SIGKILL after ``timeout``): an
    agent's shutdown pushes what it staged, and fifty of them stopped one after the other, each
    waiting on a busy server, once took the suite a quarter of an hour. Their logs by name."""
    for agent in agents:
        agent.process.terminate()
    for agent in agents:
        try:
            agent.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait()
    return {agent.name: agent.log.read_text() for agent in agents}


def start_agent(
    name: str,
    server_url: str,
    token: str,
    work_dir: Path,
    *collector_args: str,
    interval_s: float = 1.0,
    push_interval_s: float = 0.0,
) -> AgentProcess:
    """A real agent process; by default it pushes every collection (``push_interval_s`` 0), so
    that tests see readings one interval after they were collected."""
    spool = work_dir / name / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    log = work_dir / name / "agent.log"
    port = free_port()
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [
                *FLEETWATCH,
                "agent",
                "--server-url",
                server_url,
                "--token",
                token,
                "--node-name",
                name,
                "--interval",
                str(interval_s),
                "--push-interval",
                str(push_interval_s),
                "--spool-dir",
                str(spool),
                "--metrics-port",
                str(port),
                *collector_args,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return AgentProcess(name, process, log, spool, port)
