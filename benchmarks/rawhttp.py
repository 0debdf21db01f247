"""A minimal HTTP/1.1 keep-alive client on asyncio streams: a load generator that costs the
machine almost nothing (measured in ``benchmarks/ingest.py``: about 0.04 ms of client CPU per
request, against about 1 ms for httpx), so that the server, not the client, gets the cores.

It speaks only what the benchmarks need: requests with a ``Content-Length`` body, answers with a
``Content-Length`` or chunked body, ``Connection: close`` honoured.
"""

from __future__ import annotations

import asyncio

__all__ = ["RawPool", "read_response"]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the server closes the connection) of one answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip().lower()
    if headers.get("transfer-encoding") == "chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            chunks.append(chunk[:-2])
        payload = b"".join(chunks)
    else:
        payload = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, payload, headers.get("connection") == "close"


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class RawPool:
    """At most ``size`` keep-alive connections to one ``host:port``, opened on demand; a caller
    waits for a free one. The most recently used connection goes first, and one idle for longer
    than ``max_idle_s`` is closed instead of used: the server closes idle connections (uvicorn
    after 5 s), and a request sent as it does so is lost. A request that meets a connection the
    server has just closed (no answer at all) is sent once more on a new one; callers must only
    send requests that are safe to repeat (ingest is: batch ids make it idempotent).
    ``post`` raises ``OSError`` or ``asyncio.IncompleteReadError`` when that fails too."""

    def __init__(
        self, host: str, port: int, size: int, headers: dict[str, str], max_idle_s: float = 3.0
    ) -> None:
        self.host, self.port, self.max_idle_s = host, port, max_idle_s
        self._slots = asyncio.Semaphore(size)
        self._idle: list[tuple[_Connection, float]] = []
        lines = [f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        self._headers = ("\r\n".join(lines) + "\r\n").encode()
        self.reopened = 0  # requests sent again after the server closed a kept-alive connection

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        request = (
            b"POST %s HTTP/1.1\r\n" % path.encode(),
            self._headers,
            b"Content-Length: %d\r\n\r\n" % len(body),
            body,
        )
        async with self._slots:
            connection, reused = self._take()
            if connection is None:
                connection = await asyncio.open_connection(self.host, self.port)
            try:
                return await self._exchange(connection, request)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                nothing = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
                if not (reused and nothing):
                    raise
            self.reopened += 1
            connection = await asyncio.open_connection(self.host, self.port)
            return await self._exchange(connection, request)

    def _take(self) -> tuple[_Connection | None, bool]:
        now = asyncio.get_running_loop().time()
        while self._idle:
            (reader, writer), since = self._idle.pop()
            if now - since <= self.max_idle_s and not reader.at_eof():
                return (reader, writer), True
            writer.close()
        return None, False

    async def _exchange(
        self, connection: _Connection, request: tuple[bytes, ...]
    ) -> tuple[int, bytes]:
        reader, writer = connection
        try:
            writer.writelines(request)
            status, payload, close = await read_response(reader)
        except BaseException:
            writer.close()
            raise
        if close:
            writer.close()
        else:
            self._idle.append((connection, asyncio.get_running_loop().time()))
        return status, payload

    def close(self) -> None:
        for (_, writer), _ in self._idle:
            writer.close()
        self._idle.clear()
