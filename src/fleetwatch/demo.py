"""``fleetwatch demo``: the product running locally on its embedded default, in one command.

Starts the real server (uvicorn, SQLite file under ``var/demo``), creates tokens, and feeds it a
small live fleet over HTTP with the agent token, so that the API, /metrics and the docs have
something to show. Prints where to look, then runs until Ctrl-C (or ``--duration``).
"""

from __future__ import annotations

import logging
import random
import signal
import socket
import subprocess
import sys
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

__all__ = ["DemoFleet", "run_demo"]

logger = logging.getLogger(__name__)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port(preferred: int) -> int:
    if _port_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class _DemoGpu:
    uuid: str
    index: int
    sbe: int = 0
    energy_mj: int = 0
    hot: bool = False


@dataclass
class DemoFleet:
    """A handful of nodes with plausible readings, one of them running hot and noisy."""

    nodes: int = 4
    gpus_per_node: int = 8
    seed: int = 7
    boot_id: str = field(default_factory=lambda: str(uuidlib.uuid4()))

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._gpus = {
            f"demo-node-{n:02d}": [
                _DemoGpu(
                    uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'demo-{n}-{i}')}",
                    index=i,
                    hot=(n == 1 and i == 3),
                )
                for i in range(self.gpus_per_node)
            ]
            for n in range(self.nodes)
        }

    def batches(self, interval_s: float) -> list[dict[str, Any]]:
        now = datetime.now(UTC).isoformat()
        out = []
        for n, (name, gpus) in enumerate(self._gpus.items()):
            samples, events = [], []
            for gpu in gpus:
                temp = self._rng.gauss(78 if gpu.hot else 62, 1.5)
                power = self._rng.gauss(640, 25)
                gpu.energy_mj += int(power * interval_s * 1000)
                if gpu.hot and self._rng.random() < 0.3:
                    gpu.sbe += self._rng.randint(1, 4)
                samples.append(
                    {
                        "uuid": gpu.uuid,
                        "ts": now,
                        "gpu_temp_c": round(temp, 1),
                        "memory_temp_c": round(temp + 6, 1),
                        "power_w": round(power, 1),
                        "power_limit_w": 700.0,
                        "energy_mj": gpu.energy_mj,
                        "sm_clock_mhz": 1755.0 if gpu.hot else 1980.0,
                        "mem_clock_mhz": 2619.0,
                        "clocks_event_reasons": 0x20 if gpu.hot else 0,
                        "gpu_util_pct": round(min(100.0, self._rng.gauss(95, 3)), 1),
                        "fb_used_mib": 71_000.0,
                        "fb_total_mib": 81_559.0,
                        "ecc_sbe_volatile_total": gpu.sbe,
                        "ecc_dbe_volatile_total": 0,
                        "remapped_rows_correctable": gpu.sbe // 10,
                        "remapped_rows_uncorrectable": 0,
                        "remapped_rows_pending": False,
                        "remapped_rows_failure": False,
                        "pcie_replay_total": 0,
                        "nvlink_crc_flit_errors_total": 0,
                    }
                )
                if gpu.hot and self._rng.random() < 0.05:
                    events.append(
                        {
                            "kind": "xid",
                            "uuid": gpu.uuid,
                            "xid": 92,
                            "ts": now,
                            "message": "High single-bit ECC error rate",
                        }
                    )
            out.append(
                {
                    "batch_id": str(uuidlib.uuid4()),
                    "node": {
                        "name": name,
                        "interval_s": interval_s,
                        "agent_version": "demo",
                        "boot_id": self.boot_id,
                        "labels": {"cluster": "demo", "rack": f"r{n // 2 + 1:02d}"},
                    },
                    "gpus": [
                        {
                            "uuid": g.uuid,
                            "index": g.index,
                            "name": "NVIDIA H100 80GB HBM3",
                            "pci_bus_id": f"0000:{0x18 + 0x10 * g.index:02x}:00.0",
                            "serial": f"16528230{n:02d}{g.index:03d}",
                            "driver_version": "550.90.07",
                        }
                        for g in gpus
                    ],
                    "samples": samples,
                    "events": events,
                }
            )
        return out


def _demo_tokens(database_url: str, saved: Path) -> dict[str, str]:
    """The tokens saved by an earlier run if they still work, else new ones."""
    from fleetwatch.config import load_server_settings
    from fleetwatch.errors import Unauthenticated
    from fleetwatch.server.app import prepare_database
    from fleetwatch.server.auth import authenticate, create_token
    from fleetwatch.server.db.session import Database, make_engine

    settings = load_server_settings(database_url=database_url)
    db = Database(make_engine(settings))
    scopes = ("admin", "read", "agent")
    try:
        prepare_database(db, settings)
        if saved.exists():
            lines = dict(
                line.split("=", 1) for line in saved.read_text().splitlines() if "=" in line
            )
            found = {s: lines.get(f"FLEETWATCH_{s.upper()}_TOKEN", "") for s in scopes}
            try:
                with db.read() as conn:
                    for token in found.values():
                        authenticate(conn, token)
                return found
            except Unauthenticated:
                pass
        with db.write() as conn:
            made = {s: create_token(conn, name=f"demo-{s}", scope=s)[0] for s in scopes}
        saved.write_text("".join(f"FLEETWATCH_{s.upper()}_TOKEN={t}\n" for s, t in made.items()))
        return made
    finally:
        db.dispose()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready within {timeout:.0f}s")


def _banner(url: str, tokens: dict[str, str], database_url: str, data_dir: Path) -> str:
    return f"""
FleetWatch demo is running: a live simulated fleet on the embedded SQLite database.

  API docs      {url}/docs
  Nodes         {url}/v1/nodes
  Metrics       {url}/metrics        (Prometheus; needs a read token)
  Database      {database_url}
  Server log    {data_dir / "server.log"}

Tokens (also in {data_dir / "tokens.env"}):
  admin   {tokens["admin"]}
  read    {tokens["read"]}
  agent   {tokens["agent"]}

Try:
  curl -s -H "Authorization: Bearer {tokens["read"]}" {url}/v1/nodes
  curl -s -H "Authorization: Bearer {tokens["read"]}" "{url}/v1/events?kind=xid"
  curl -s -H "Authorization: Bearer {tokens["read"]}" {url}/metrics | grep temperature

Ctrl-C stops it; the data stays in {data_dir}/ for the next run.
"""


def run_demo(
    *,
    port: int = 8400,
    data_dir: Path = Path("var/demo"),
    interval_s: float = 2.0,
    duration_s: float | None = None,
    nodes: int = 4,
) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{(data_dir / 'fleetwatch.db').resolve()}"
    tokens = _demo_tokens(database_url, data_dir / "tokens.env")
    port = _pick_port(port)
    url = f"http://127.0.0.1:{port}"
    log = data_dir / "server.log"
    with log.open("ab") as sink:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetwatch",
                "server",
                "--port",
                str(port),
                "--database-url",
                database_url,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        _wait_ready(url, server)
        fleet = DemoFleet(nodes=nodes)
        sys.stdout.write(_banner(url, tokens, database_url, data_dir))
        sys.stdout.flush()
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {tokens['agent']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            while not stop and (duration_s is None or time.monotonic() - started < duration_s):
                for batch in fleet.batches(interval_s):
                    client.post("/v1/ingest", json=batch).raise_for_status()
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
