"""Raw loopback sockets for the slow-client fault tests: what an HTTP client library will not do
(stay silent, send half a body and stop, hold a connection open) done by hand, and the server's
own counters read back from ``/metrics``.

Every socket is opened in a ``with`` block by the caller; every wait here has a deadline and a
bounded number of steps.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["connect", "metric", "request", "sample", "wait_closed"]


def connect(url: str, timeout: float = 30.0) -> socket.socket:
    """A TCP connection to the server at ``url`` (loopback only)."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", url
    sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def wait_closed(sock: socket.socket, timeout: float = 60.0) -> bytes:
    """Everything the server sends until it closes the connection (EOF or reset); fails if it
    is still open after ``timeout`` seconds."""
    received = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return bytes(received)
        if not chunk:
            return bytes(received)
        received += chunk
    raise AssertionError(f"the server kept the connection open for {timeout:.0f} s")


def request(
    sock: socket.socket, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One keep-alive request without a body on ``sock``; the status and body of the answer
    (which must carry a Content-Length)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before answering {method} {path}: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(":", 1) for line in header_lines)
    length = int(next(v for k, v in fields.items() if k.strip().lower() == "content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed in the middle of the answer to {method} {path}"
        body += chunk
    return int(status_line.split()[1]), body


def metric(url: str, token: str, name: str, **labels: str) -> float:
    """One sample of the server's ``/metrics`` page (0 when absent), read on a new connection."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        answer = client.get("/metrics", timeout=30)
    answer.raise_for_status()
    return sample(answer.text, name, **labels)


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return 0.0
