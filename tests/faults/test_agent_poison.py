"""A poisoned batch must not block a node's telemetry; a NUL in a kernel log line must not either.

1. A real agent pushes through a small loopback proxy that forwards to a real server
   (PostgreSQL) but answers 500 to every push of one batch: the critical batch holding an Xid
   from a process named ``poison-pill``. With ``--poison-after 2`` the agent sets that batch
   aside once the server has taken the next batch, every other batch arrives, and the server
   stores a ``batch_set_aside`` event naming it. Printed: the time from the poisoned batch's first
   500 to the node's next stored batch (a figure, not asserted).
2. A real kernel log line (the fixture's Xid 79) with a NUL injected in its process name goes
   through a real agent to a real server on PostgreSQL: the Xid 79 is stored.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.faults.waiting import wait_for as _wait_for
from tests.integration.live import (
    AgentProcess,
    create_token,
    fleetwatch,
    live_server,
    start_agent,
)

NODE = "sim-node-000"
PILL = "poison-pill"


class PoisonProxy:
    """Forwards every request to ``upstream``, except pushes of the batch holding the pill."""

    def __init__(self, upstream: str) -> None:
        self._upstream = httpx.Client(base_url=upstream, timeout=30)
        self._lock = threading.Lock()
        self.poisoned_batch: str | None = None
        self.pill_answers = 0
        self.first_500: float | None = None
        self.next_stored: float | None = None  # the node's first batch stored after first_500
        self.stored: list[str] = []

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> httpx.Response:
        batch = json.loads(gzip.decompress(body)) if path == "/v1/ingest" else None
        if batch is not None and any(e.get("process") == PILL for e in batch["events"]):
            with self._lock:
                self.poisoned_batch = batch["batch_id"]
                self.pill_answers += 1
                if self.first_500 is None:
                    self.first_500 = time.monotonic()
            return httpx.Response(500, json={"error": "internal server error"})
        forwarded = {k: v for k, v in headers.items() if k.lower() != "host"}
        response = self._upstream.request(method, path, headers=forwarded, content=body)
        if batch is not None and response.status_code == 200:
            with self._lock:
                self.stored.append(batch["batch_id"])
                if self.first_500 is not None and self.next_stored is None:
                    self.next_stored = time.monotonic()
        return response

    def close(self) -> None:
        self._upstream.close()


@contextmanager
def running(proxy: PoisonProxy) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            response = proxy.answer(self.command, self.path, dict(self.headers.items()), body)
            self.send_response(response.status_code)
            self.send_header("Content-Type", response.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(response.content)))
            self.end_headers()
            self.wfile.write(response.content)

        do_GET = do_POST = _relay

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        proxy.close()


def _sim_agent(tmp_path: Path, url: str, token: str, kernel_log: Path, *extra: str) -> AgentProcess:
    fleetwatch("sim", "init", "--nodes", "1", "--gpus", "2", "--out", str(tmp_path / "sim"))
    kernel_log.write_text("")
    return start_agent(
        NODE,
        url,
        token,
        tmp_path / "agents",
        "--collectors",
        "sim,kernel-log",
        "--sim-spec",
        str(tmp_path / "sim" / "fleet.json"),
        "--kernel-log",
        str(kernel_log),
        *extra,
        interval_s=0.2,
    )


def _first_gpu_bus(read: httpx.Client) -> str:
    """The kernel's spelling (``0000:18:00``) of the bus id of the node's first GPU."""
    gpus: list[dict[str, Any]] = []

    def registered() -> bool:
        nonlocal gpus
        response = read.get(f"/v1/nodes/{NODE}")
        gpus = response.json().get("gpus", []) if response.status_code == 200 else []
        return bool(gpus)

    _wait_for("the node's GPUs on the server", registered, timeout=60)
    bus = gpus[0]["pci_bus_id"]
    assert isinstance(bus, str)
    return bus.rsplit(".", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_batch_failing_with_500_is_set_aside_and_the_node_goes_on(
    database_url: str, tmp_path: Path
) -> None:
    agent_token, read_token = (
        create_token(database_url, "agent"),
        create_token(database_url, "read"),
    )
    kernel_log = tmp_path / "kern.log"
    with live_server(database_url, tmp_path) as server:
        proxy = PoisonProxy(server.url)
        with running(proxy) as url:
            agent = _sim_agent(tmp_path, url, agent_token, kernel_log, "--poison-after", "2")
            try:
                with server.client(read_token) as read:
                    bus = _first_gpu_bus(read)
                    with kernel_log.open("a") as log:
                        log.write(
                            f"[2345.678901] NVRM: Xid (PCI:{bus}): 43, pid=4242, name={PILL}, "
                            "Ch 00000008\n"
                        )

                    def reported() -> list[dict[str, Any]]:
                        events = read.get(
                            "/v1/events", params={"kind": "batch_set_aside", "node": NODE}
                        ).json()["data"]
                        return [e["details"] for e in events]

                    _wait_for("the batch_set_aside event on the server", reported, timeout=90)
                    (details,) = reported()
                    set_aside = agent.metric("fleetwatch_agent_set_aside_batches_total")
            finally:
                log_text = agent.stop()
    assert proxy.poisoned_batch is not None and proxy.first_500 is not None
    assert proxy.next_stored is not None
    # The event names the poisoned batch and how often the server failed it.
    assert details["batch_id"] == proxy.poisoned_batch
    assert (details["status"], details["attempts"]) == (500, proxy.pill_answers)
    assert proxy.pill_answers >= 5 and details["failing_s"] >= 2
    assert set_aside == 1
    kept = tmp_path / "agents" / NODE / "spool" / "rejected" / f"{proxy.poisoned_batch}.json.gz"
    held = json.loads(gzip.decompress(kept.read_bytes()))
    assert [e["process"] for e in held["events"]] == [PILL]
    # Every other batch the agent made arrived: the routine ones it spooled (one a cycle), none
    # left in its spool, the poisoned critical one set aside.
    cycles = sum(1 for line in log_text.splitlines() if " spooled " in line)
    spool_db = sqlite3.connect(tmp_path / "agents" / NODE / "spool" / "spool.db")
    (left,) = spool_db.execute("SELECT COUNT(*) FROM batches").fetchone()
    spool_db.close()
    engine = create_engine(database_url)
    with engine.connect() as conn:
        stored = conn.execute(
            text(
                "SELECT COUNT(*) FROM ingest_batches b JOIN nodes n ON n.id = b.node_id"
                " WHERE n.name = :node"
            ),
            {"node": NODE},
        ).scalar_one()
    engine.dispose()
    assert left == 0
    assert stored == len(proxy.stored) == cycles, (stored, len(proxy.stored), cycles)
    print(
        f"poisoned batch: {proxy.pill_answers} answers of 500 over {details['failing_s']:.1f} s "
        f"(--poison-after 2), set aside, reported; {stored} other batches stored, none lost; "
        f"telemetry resumed {proxy.next_stored - proxy.first_500:.2f} s after the first 500"
    )


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_nul_in_a_kernel_log_line_reaches_postgresql(
    database_url: str, tmp_path: Path, shared_dir: Path
) -> None:
    agent_token, read_token = (
        create_token(database_url, "agent"),
        create_token(database_url, "read"),
    )
    fixture = (shared_dir / "fixtures" / "kernel_logs" / "xid_lines_curated.log").read_text()
    (line,) = [x for x in fixture.splitlines() if x.startswith("[6781741.548779] NVRM: Xid")]
    kernel_log = tmp_path / "kern.log"
    with live_server(database_url, tmp_path) as server:
        agent = _sim_agent(tmp_path, server.url, agent_token, kernel_log)
        try:
            with server.client(read_token) as read:
                bus = _first_gpu_bus(read)
                poisoned = line.replace("PCI:0000:91:00", f"PCI:{bus}").replace(
                    "name=<unknown>", "name=python\x00worker"
                )
                assert "\x00" in poisoned and bus in poisoned
                with kernel_log.open("a") as log:
                    log.write(poisoned + "\n")

                def stored() -> list[dict[str, Any]]:
                    found = read.get("/v1/events", params={"xid": 79, "node": NODE})
                    return list(found.json()["data"])

                _wait_for("the Xid 79 on the server", stored, timeout=60)
                (event,) = stored()
        finally:
            log_text = agent.stop()
    assert event["process"] == "python\ufffdworker"
    assert event["pci_bus_id"] == f"{bus}.0"
    assert event["gpu_uuid"] is not None
    assert "server answered 5" not in log_text
    print(f"Xid 79 with a NUL in its process name stored on PostgreSQL as {event['process']!r}")
