"""uvicorn's HTTP/1.1 protocol (httptools) with deadlines on each request and a cap on connections.

uvicorn times out only a kept-alive connection between requests. Here every connection has at
most one deadline armed, each closing the connection when it passes (counted and told by the
process's :class:`~fleetwatch.server.http_guard.ConnectionGuard`):

- ``header_timeout``: from the connection's start (or, on a kept-alive connection, from its next
  request's first byte) until the request's head (its line and headers) is complete;
- ``body_timeout``: from then until the body's last byte. Not for a pipelined request, which
  waits with reading paused while the one before it is answered;
- ``idle``: uvicorn's keep-alive timer, from an answer to the next request's first byte, set to
  ``idle_timeout_s``.

While the application works on a request (a long-poll may take minutes) no deadline runs. A
connection beyond the process's cap is answered 503 and closed before anything is read.

Over TLS, each request's scope also carries what the handshake established about the client
(``scope["extensions"]["tls"]``, :mod:`fleetwatch.server.client_certs`): its verified
certificate's names, which decide the nodes it may speak for
(:mod:`fleetwatch.server.node_binding`).

``fleetwatch server`` runs uvicorn with this protocol (``http=``). Without the guard in the
lifespan state (an app that never started) it is uvicorn's protocol unchanged, bar the scope's
TLS extension.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from fleetwatch.server.client_certs import tls_extension
from fleetwatch.server.http_guard import LIFESPAN_KEY, ConnectionGuard

__all__ = ["GuardedHttpToolsProtocol"]

_REFUSED = b"Too many connections to this server process; retry later.\n"
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\nretry-after: 1\r\n\r\n%s"
) % (len(_REFUSED), _REFUSED)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._guard: ConnectionGuard | None = app_state.get(LIFESPAN_KEY)
        self._counted = False
        self._deadline: asyncio.TimerHandle | None = None
        self._tls: dict[str, Any] | None = None  # the scope's TLS extension, per connection
        if self._guard is not None:
            # Read by uvicorn when it arms its keep-alive timer (call_later takes a float).
            self.timeout_keep_alive = self._guard.limits.idle_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:  # asyncio calls this once the handshake is done
            self._tls = tls_extension(ssl_object)
        if self._guard is None:
            return
        if not self._guard.opened(self.client):
            transport.write(_REFUSAL)
            transport.close()
            return
        self._counted = True
        self._arm("header_timeout", self._guard.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._let_go()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the connection over (and its end): uncounted here, as
        # uvicorn takes it out of its own connections.
        self._let_go()
        super().handle_websocket_upgrade()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}  # type: ignore[dict-item]
        # The first request's deadline runs from the connection's start: not moved here.
        if self._guard is not None and self._deadline is None:
            self._arm("header_timeout", self._guard.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        upgrading = self.parser.should_upgrade() and self._should_upgrade()
        if self._guard is None or upgrading or self.pipeline or self.transport.is_closing():
            return
        self._arm("body_timeout", self._guard.limits.body_timeout_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def timeout_keep_alive_handler(self) -> None:
        if self._guard is not None and not self.transport.is_closing():
            self._guard.timed_out("idle", self.client)
        super().timeout_keep_alive_handler()

    def _arm(self, reason: str, delay_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._expire, reason)

    def _let_go(self) -> None:
        self._disarm()
        if self._counted and self._guard is not None:
            self._counted = False
            self._guard.closed()

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, reason: str) -> None:
        self._deadline = None
        if self._guard is None or self.transport.is_closing():
            return
        self._guard.timed_out(reason, self.client)
        # A request being handled sees its client gone (starlette's ClientDisconnect).
        self.transport.close()
