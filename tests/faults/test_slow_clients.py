"""Silent, slow, too many and aborting clients against a real `fleetwatch server` process.

Each test starts its own server with small limits (a second or two, a handful of connections),
set through the environment as an operator would, talks to it over loopback with raw sockets
(rawhttp.py) and waits, with generous deadlines, for what it expects: the connection closed, a
counter on ``/metrics`` changed. No elapsed time is asserted.

- a connection that never sends a byte is closed at ``http_header_timeout_s``, one kept alive
  after its answer at ``http_idle_timeout_s``; both counted;
- an upload whose body trickles in is cut at ``http_body_timeout_s`` and counted;
- beyond ``http_max_connections`` a connection is refused (503) and counted, and a normal
  request succeeds once the held connections are gone;
- uploads aborted half-way are counted one by one and leave at most one short log line each,
  never a traceback.
"""

from __future__ import annotations

import select
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.factories import make_batch
from tests.faults.rawhttp import connect, metric, request, sample, wait_closed
from tests.faults.waiting import wait_for
from tests.integration.live import LiveServer, create_token, live_server

pytestmark = pytest.mark.slow

CLOSED = "fleetwatch_http_connections_closed_total"
OPEN = "fleetwatch_http_connections_open"
ABORTED = "fleetwatch_http_requests_aborted_total"


@dataclass
class Server:
    live: LiveServer
    agent: str
    read: str

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.live.url, self.read, name, **labels)

    def upload_head(self, length: int) -> bytes:
        """The request line and headers of a push announcing a ``length``-byte body."""
        return (
            "POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {self.agent}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()


Start = Callable[..., AbstractContextManager[Server]]


@pytest.fixture
def start(
    tmp_path: Path, migrated_sqlite_file: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Start]:
    @contextmanager
    def started(**settings: float) -> Iterator[Server]:
        path = tmp_path / "fleetwatch.db"
        shutil.copyfile(migrated_sqlite_file, path)
        url = f"sqlite:///{path}"
        for name, value in settings.items():
            monkeypatch.setenv(f"FLEETWATCH_SERVER_{name.upper()}", str(value))
        agent, read = create_token(url, "agent"), create_token(url, "read")
        with live_server(url, tmp_path) as live:
            yield Server(live, agent, read)

    yield started


def test_a_silent_connection_is_closed_at_the_header_timeout_an_idle_one_at_the_idle_timeout(
    start: Start,
) -> None:
    with start(http_header_timeout_s=1, http_idle_timeout_s=1) as server:
        with connect(server.live.url) as silent:
            assert wait_closed(silent) == b""  # never a byte sent, never an answer
        wait_for(
            "the header timeout counted", lambda: server.metric(CLOSED, reason="header_timeout")
        )
        with connect(server.live.url) as kept:
            assert request(kept, "GET", "/healthz")[0] == 200
            assert wait_closed(kept) == b""  # kept alive, then nothing more
        wait_for("the idle timeout counted", lambda: server.metric(CLOSED, reason="idle"))
    log = server.live.log.read_text(errors="replace")
    assert "header timeout" in log
    assert "Traceback" not in log


def test_a_slow_body_is_cut_at_the_body_timeout(start: Start) -> None:
    with start(http_body_timeout_s=1) as server:
        with connect(server.live.url) as slow:
            slow.sendall(server.upload_head(100_000) + b"{")
            cut = False
            for _ in range(600):  # a byte every 0.1 s, for a minute at most
                try:
                    slow.sendall(b" ")
                except OSError:  # reset or broken pipe: the server closed it
                    cut = True
                    break
                readable, _, _ = select.select([slow], [], [], 0.1)
                if readable:
                    try:
                        slow.recv(65536)  # EOF (or an answer, then EOF)
                    except ConnectionResetError:
                        pass
                    cut = True
                    break
            assert cut, "a body sent a byte every 0.1 s was never cut"
        wait_for("the body timeout counted", lambda: server.metric(CLOSED, reason="body_timeout"))
        assert server.metric(CLOSED, reason="body_timeout") == 1
        # The push it cut is an aborted upload, counted as such (and not a traceback).
        wait_for("the cut upload counted", lambda: server.metric(ABORTED, route="/v1/ingest"))
    log = server.live.log.read_text(errors="replace")
    assert "body timeout" in log
    assert "Traceback" not in log


def test_connections_beyond_the_cap_are_refused_counted_and_service_resumes(start: Start) -> None:
    cap = 4
    limits = {"http_max_connections": cap, "http_header_timeout_s": 300, "http_idle_timeout_s": 300}
    with start(**limits) as server:
        read = {"Authorization": f"Bearer {server.read}"}
        with connect(server.live.url) as first:

            def page() -> str:
                status, body = request(first, "GET", "/metrics", read)
                assert status == 200, body
                return body.decode()

            # Counted through the one connection this test keeps: once it is the only one open,
            # every other connection is one this test opened after it.
            wait_for("no connection open but this one", lambda: sample(page(), OPEN) == 1)
            held: list[socket.socket] = []
            try:
                for _ in range(cap - 1):  # answered: each is in the server's count
                    held.append(connect(server.live.url))
                    assert request(held[-1], "GET", "/healthz")[0] == 200
                with connect(server.live.url) as extra:
                    refused = wait_closed(extra)
                assert refused == b"" or refused.startswith(b"HTTP/1.1 503"), refused
                assert sample(page(), CLOSED, reason="limit") == 1
            finally:
                for sock in held:
                    sock.close()
            wait_for("the held connections gone", lambda: sample(page(), OPEN) == 1)
        with server.live.client(server.read) as client:
            assert client.get("/v1/nodes").status_code == 200
    log = server.live.log.read_text(errors="replace")
    assert "connection limit" in log
    assert "Traceback" not in log


def test_aborted_uploads_are_counted_and_leave_at_most_a_short_line_each(start: Start) -> None:
    aborts = 20
    with start() as server:
        for _ in range(aborts):
            with connect(server.live.url) as upload:
                upload.sendall(server.upload_head(50_000) + b'{"batch_id": "aborted-')
            # closed here, 49,980 bytes short
        wait_for(
            f"{aborts} aborted uploads counted",
            lambda: server.metric(ABORTED, route="/v1/ingest") >= aborts,
        )
        assert server.metric(ABORTED, route="/v1/ingest") == aborts
        with server.live.client(server.agent) as push:  # the server still takes pushes
            assert push.post("/v1/ingest", json=make_batch("node-after")).status_code == 200
    log = server.live.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert "Exception in ASGI application" not in log
    about = [line for line in log.splitlines() if "ClientDisconnect" in line or "abort" in line]
    assert len(about) <= aborts, about
    assert all(len(line) < 300 for line in about), about
