"""Real ``fleetwatch server`` processes and throwaway PostgreSQL databases for the benchmarks.

Shared by ``benchmarks/ingest.py`` and ``benchmarks/fleet_scale.py``: the server is started the
way an operator starts it (the CLI, product defaults, any ``FLEETWATCH_SERVER_*`` variables of
the caller's environment left out), and tokens are made with ``fleetwatch token create``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from procstats import process_tree
from sqlalchemy.engine import URL, make_url

from fleetwatch.config import ServerSettings

__all__ = [
    "FLEETWATCH",
    "ServerGroup",
    "ServerProcess",
    "ThrowawayDatabase",
    "create_token",
    "fleetwatch_cli",
    "free_port",
    "running_server",
]

FLEETWATCH = [sys.executable, "-m", "fleetwatch"]


def fleetwatch_cli(*args: str) -> str:
    result = subprocess.run(
        [*FLEETWATCH, *args], capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"fleetwatch {' '.join(args[:2])} failed:\n{result.stderr}")
    return result.stdout


def create_token(database_url: str, scope: str, name: str) -> str:
    """A new token (``fleetwatch token create`` prints it on its last line)."""
    out = fleetwatch_cli(
        "token", "create", "--scope", scope, "--name", name, "--database-url", database_url
    )
    return out.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path


@contextlib.contextmanager
def running_server(
    database_url: str,
    workdir: Path,
    workers: int,
    extra_env: dict[str, str],
    role: str | None = None,
    stop_timeout_s: float = 15.0,
    extra_args: Sequence[str] = (),
    verify: ssl.SSLContext | None = None,
) -> Iterator[ServerProcess]:
    """``verify``: the server serves HTTPS (its ``--tls-*`` flags among ``extra_args``) and this
    context checks it (with a client certificate where the server requires one)."""
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETWATCH_SERVER_")}
    env.update(extra_env)
    with log_path.open("wb") as sink:
        process = subprocess.Popen(
            [
                *FLEETWATCH,
                "server",
                "--port",
                str(port),
                "--database-url",
                database_url,
                "--workers",
                str(workers),
                *(("--role", role) if role else ()),
                *extra_args,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    scheme = "https" if verify is not None else "http"
    server = ServerProcess(f"{scheme}://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise SystemExit(f"server exited early:\n{log_path.read_text()}")
            try:
                ready = httpx.get(f"{server.url}/readyz", timeout=1, verify=verify or True)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready after 60 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class ServerGroup:
    """The server processes measured together, and those the load goes to: node ``i`` posts to
    ``targets[i % len(targets)]`` (several API processes behind no load balancer)."""

    servers: list[ServerProcess]
    targets: list[ServerProcess]

    @classmethod
    def one(cls, server: ServerProcess) -> ServerGroup:
        return cls([server], [server])

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.targets]

    def pids(self) -> list[int]:
        return [pid for s in self.servers for pid in process_tree(s.process.pid)]


class ThrowawayDatabase:
    """A fresh database ``fleetwatch_bench_<random>`` on the PostgreSQL server that
    ``server_url`` names; :meth:`drop` removes it (connections and all)."""

    def __init__(self, server_url: str) -> None:
        base = make_url(ServerSettings(database_url=server_url).database_url)
        self.name = f"fleetwatch_bench_{secrets.token_hex(4)}"
        self.admin_dsn = libpq_dsn(base)
        with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        target = base.set(database=self.name)
        self.url = target.render_as_string(hide_password=False)
        self.dsn = libpq_dsn(target)

    def drop(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def libpq_dsn(url: URL) -> str:
    """The URL as libpq (psycopg.connect) takes it: no SQLAlchemy driver suffix."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)
