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
    waits for a free one. ``post`` raises ``OSError`` (or ``asyncio.IncompleteReadError``) when the
    connection breaks; the broken connection is dropped and the next caller opens a new one."""

    def __init__(self, host: str, port: int, size: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Connection] = []
        lines = [f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
        self._headers = ("\r\n".join(lines) + "\r\n").encode()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        async with self._slots:
            reader, writer = self._idle.pop() if self._idle else await self._open()
            try:
                writer.writelines(
                    (
                        b"POST %s HTTP/1.1\r\n" % path.encode(),
                        self._headers,
                        b"Content-Length: %d\r\n\r\n" % len(body),
                        body,
                    )
                )
                status, payload, close = await read_response(reader)
            except BaseException:
                writer.close()
                raise
            if close:
                writer.close()
            else:
                self._idle.append((reader, writer))
            return status, payload

    async def _open(self) -> _Connection:
        return await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
