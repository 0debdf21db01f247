"""Connection limits: the guarded protocol's deadlines on a fake transport and a fake loop (whose
timers the test fires by hand), the process's counts, the throttled lines, and an aborted upload
as the app answers it. The real server process: tests/faults/test_slow_clients.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from starlette.requests import ClientDisconnect
from uvicorn.config import Config
from uvicorn.server import ServerState

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.http_guard import (
    FD_RESERVE,
    LIFESPAN_KEY,
    ConnectionGuard,
    ConnectionLimits,
    connection_cap,
)
from fleetwatch.server.http_protocol import GuardedHttpToolsProtocol
from fleetwatch.server.log_throttle import ThrottledLog
from fleetwatch.server.runtime.metric_families import ServerMetrics

LIMITS = ConnectionLimits(
    header_timeout_s=10.0, body_timeout_s=60.0, idle_timeout_s=5.0, max_connections=2
)
HEAD = b"POST /v1/ingest HTTP/1.1\r\nHost: fw\r\nContent-Length: 10\r\n\r\n"


class Timer:
    def __init__(self, delay: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.delay, self.callback, self.args, self.cancelled = delay, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        assert not self.cancelled
        self.callback(*self.args)


class FakeTask:
    def add_done_callback(self, callback: Callable[..., None]) -> None:
        pass


class FakeLoop:
    """Timers kept for the test to fire; the ASGI tasks never run (the app is not under test)."""

    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> Timer:
        timer = Timer(delay, callback, args)
        self.timers.append(timer)
        return timer

    def create_task(self, coro: Coroutine[Any, Any, None], **_: Any) -> FakeTask:
        coro.close()
        return FakeTask()

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8400)}.get(name)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never run: FakeLoop drops tasks
    raise AssertionError("not called")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def guard(registry: CollectorRegistry) -> ConnectionGuard:
    return ConnectionGuard(LIMITS, ServerMetrics(registry))


@pytest.fixture
def connect(
    guard: ConnectionGuard,
) -> Callable[..., tuple[GuardedHttpToolsProtocol, FakeTransport, FakeLoop]]:
    config = Config(app=_app, http="httptools", log_config=None)
    config.load()
    server_state = ServerState()

    def connect(
        with_guard: bool = True,
    ) -> tuple[GuardedHttpToolsProtocol, FakeTransport, FakeLoop]:
        loop, transport = FakeLoop(), FakeTransport()
        state = {LIFESPAN_KEY: guard} if with_guard else {}
        protocol = GuardedHttpToolsProtocol(config, server_state, state, _loop=loop)  # type: ignore[arg-type]
        protocol.connection_made(transport)  # type: ignore[arg-type]
        return protocol, transport, loop

    return connect


def closed(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("fleetwatch_http_connections_closed_total", {"reason": reason})


def test_a_silent_connection_is_closed_at_the_header_timeout(
    connect: Callable[..., Any], registry: CollectorRegistry
) -> None:
    protocol, transport, loop = connect()
    [deadline] = loop.armed()
    assert deadline.delay == LIMITS.header_timeout_s
    deadline.fire()
    assert transport.closing and transport.written == b""
    assert closed(registry, "header_timeout") == 1
    protocol.connection_lost(None)


def test_the_first_byte_does_not_restart_the_first_requests_header_deadline(
    connect: Callable[..., Any],
) -> None:
    protocol, _, loop = connect()
    [deadline] = loop.armed()
    protocol.data_received(b"POST /v1/ingest HTTP/1.1\r\nHost: f")
    assert loop.armed() == [deadline]
    protocol.connection_lost(None)


def test_a_body_short_of_its_length_is_closed_at_the_body_timeout(
    connect: Callable[..., Any], registry: CollectorRegistry
) -> None:
    protocol, transport, loop = connect()
    protocol.data_received(HEAD + b"{}")
    [deadline] = loop.armed()
    assert deadline.delay == LIMITS.body_timeout_s
    deadline.fire()
    assert transport.closing
    assert closed(registry, "body_timeout") == 1
    assert closed(registry, "header_timeout") == 0
    protocol.connection_lost(None)


def test_a_complete_request_leaves_no_deadline_while_it_is_answered(
    connect: Callable[..., Any],
) -> None:
    protocol, transport, loop = connect()
    protocol.data_received(HEAD + b'{"a": 123}')
    assert loop.armed() == []  # a long-poll answers when it likes
    protocol.on_response_complete()  # answered: uvicorn's keep-alive timer, at our idle timeout
    [idle] = loop.armed()
    assert idle.delay == LIMITS.idle_timeout_s
    protocol.data_received(b"GET /healthz HTTP/1.1\r\n")  # the next request's first byte
    [header] = loop.armed()
    assert header.delay == LIMITS.header_timeout_s
    assert not transport.closing
    protocol.connection_lost(None)


def test_an_idle_kept_alive_connection_is_closed_and_counted(
    connect: Callable[..., Any], registry: CollectorRegistry
) -> None:
    protocol, transport, loop = connect()
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nHost: fw\r\n\r\n")
    protocol.on_response_complete()
    [idle] = loop.armed()
    idle.fire()
    assert transport.closing
    assert closed(registry, "idle") == 1
    protocol.connection_lost(None)


def test_beyond_the_cap_a_connection_is_refused_with_503_and_counted(
    connect: Callable[..., Any], guard: ConnectionGuard, registry: CollectorRegistry
) -> None:
    held = [connect(), connect()]
    assert guard.open == LIMITS.max_connections
    assert registry.get_sample_value("fleetwatch_http_connections_open") == 2
    refused, transport, loop = connect()
    assert transport.written.startswith(b"HTTP/1.1 503 ") and transport.closing
    assert loop.armed() == []
    assert closed(registry, "limit") == 1
    refused.connection_lost(None)
    assert guard.open == 2  # a refused connection was never counted in
    held[0][0].connection_lost(None)
    again, transport, _ = connect()
    assert not transport.closing and guard.open == 2
    for protocol in (held[1][0], again):
        protocol.connection_lost(None)
    assert guard.open == 0


def test_without_the_guard_it_is_uvicorns_protocol(connect: Callable[..., Any]) -> None:
    protocol, transport, loop = connect(with_guard=False)
    assert loop.armed() == []
    protocol.data_received(HEAD + b"{}")
    assert loop.armed() == [] and not transport.closing
    protocol.connection_lost(None)


@pytest.mark.parametrize(
    ("configured", "fd_limit", "cap"),
    [(4096, None, 4096), (4096, 20_000, 4096), (4096, 1024, 1024 - FD_RESERVE), (10, 100, 1)],
)
def test_the_cap_stays_below_the_open_files_limit(
    configured: int, fd_limit: int | None, cap: int
) -> None:
    assert connection_cap(configured, fd_limit) == cap


def test_a_throttled_line_says_how_many_were_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = ThrottledLog(logging.getLogger("test.throttle"), every_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.throttle"):
        written = [log.log(logging.WARNING, "k", "closed %s", n) for n in range(5)]
        assert log.log(logging.WARNING, "other", "another kind")
        now[0] = 61.0
        assert log.log(logging.WARNING, "k", "closed %s", 5)
    assert written == [True, False, False, False, False]
    assert [r.getMessage() for r in caplog.records] == [
        "closed 0",
        "another kind",
        "closed 5 (4 more like it not logged since the last such line)",
    ]


def test_an_aborted_upload_is_counted_by_route_in_one_line_without_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path / 'fw.db'}",
        background_jobs=False,
        metrics_require_token=False,
        _env_file=None,
    )
    app = create_app(settings)

    @app.post("/test/upload/{name}")
    async def upload(request: Request, name: str) -> None:
        raise ClientDisconnect()  # what request.stream() raises when the client is gone

    with TestClient(app) as client, caplog.at_level(logging.INFO):
        for _ in range(3):
            assert client.post("/test/upload/a", content=b"x").status_code == 499
        metrics = client.get("/metrics").text
    route = 'route="/test/upload/{name}"'
    assert f"fleetwatch_http_requests_aborted_total{{{route}}} 3.0" in metrics
    lines = [r for r in caplog.records if "aborted upload" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert lines[0].levelno == logging.INFO


def test_a_connection_upgraded_to_a_websocket_leaves_the_count(
    connect: Callable[..., Any], guard: ConnectionGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken_over: list[bytes] = []

    class WebSocket:  # stands in for uvicorn's WebSocket protocol, which takes the connection
        def __init__(self, **_: Any) -> None:
            pass

        def connection_made(self, transport: Any) -> None:
            pass

        def data_received(self, data: bytes) -> None:
            taken_over.append(data)

    protocol, transport, loop = connect()
    monkeypatch.setattr(protocol, "ws_protocol_class", WebSocket)
    transport.set_protocol = lambda new: None
    protocol.data_received(
        b"GET /ws HTTP/1.1\r\nHost: fw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    assert taken_over and guard.open == 0 and loop.armed() == []
