"""A loopback TCP proxy that can hold the server's answers, so a test can kill the server while
requests are in flight and their responses not yet delivered.

Bytes pass through untouched (HTTP keep-alive and all). While ``hold()`` is in force the bytes
the server sends back are kept, not forwarded; ``held_connections`` says how many connections
have an answer waiting. When the server side of a connection closes (the server was killed),
the client side is closed too, without what was held: the client sees a dropped connection
after the server has done the work, which is the window where a retry must not duplicate.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["HoldProxy"]


class HoldProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._holding = threading.Event()
        self._lock = threading.Lock()
        self._held: set[int] = set()  # ids of connections with an answer held back
        self._closed = False
        self.connections = 0
        self.dropped_answers: list[str] = []  # status lines of answers never delivered
        threading.Thread(target=self._accept, name="holdproxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def held_connections(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self) -> None:
        self._holding.set()

    def release(self) -> None:
        self._holding.clear()  # each pump flushes what it kept within its next poll

    @contextmanager
    def holding(self) -> Iterator[HoldProxy]:
        self.hold()
        try:
            yield self
        finally:
            self.release()

    def close(self) -> None:
        self._closed = True
        self.release()
        self._listener.close()

    # -- internals ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:  # the server is down: the client sees a refused-like close
                client.close()
                continue
            upstream.settimeout(None)
            self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        key = id(source)
        kept = bytearray()
        try:
            if answers:  # inside the try: the other pump may already have closed this socket
                source.settimeout(0.1)  # poll, to flush what was kept once the hold is released
            while True:
                try:
                    data = source.recv(65536)
                except TimeoutError:
                    if kept and not self._holding.is_set():
                        sink.sendall(bytes(kept))
                        kept.clear()
                        with self._lock:
                            self._held.discard(key)
                    continue
                if not data:
                    break
                if answers and self._holding.is_set():
                    kept += data
                    with self._lock:
                        self._held.add(key)
                    continue
                if kept:
                    sink.sendall(bytes(kept))
                    kept.clear()
                    with self._lock:
                        self._held.discard(key)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                if key in self._held:
                    self._held.discard(key)
                    self.dropped_answers.append(bytes(kept).split(b"\r\n", 1)[0].decode("latin-1"))
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
