"""A stand-in for the FleetWatch server's scheduler API, for adapter tests.

It implements exactly the contract the adapters code against (``fleetwatch.adapters.client``):
list evictions by state (several ``state`` values, a change ``cursor`` in every answer,
``changed_after`` and the ``wait`` long-poll), ack/complete/reject, and
``POST /v1/nodes/{name}/return``, behind bearer tokens, on a real localhost port
(``ThreadingHTTPServer`` in a thread), and records every call. Used where the real server's
evictions router is not there to test against.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeSchedulerApi", "serve_fake_api"]


def _now() -> str:
    return datetime.now(UTC).isoformat()


class FakeSchedulerApi:
    """Evictions in memory; ``tokens`` maps a bearer token to the name it claims under."""

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        self.tokens = tokens or {"sched-token": "slurm-adapter"}
        self.evictions: dict[int, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.url = ""
        self.cursor = 0  # bumped by every change, as the server's audit trail is
        self._changed_at: dict[int, int] = {}  # eviction id -> cursor of its last change
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # wakes long-polls
        self._closing = False
        self.waiting = 0  # long-polls held right now
        # node -> the server's 409 message: the return gate (no passing validation) refuses it
        self.unvalidated: dict[str, str] = {}

    def add(self, node: str, state: str = "pending", **fields: Any) -> dict[str, Any]:
        with self._lock:
            eviction_id = max(self.evictions, default=0) + 1
            eviction = {
                "id": eviction_id,
                "node": node,
                "state": state,
                "reason_kind": "rule",
                "reason": f"xid 79 on {node}",
                "evidence": {},
                "expected_saving_usd": None,
                "dry_run": False,
                "created_at": _now(),
                "updated_at": _now(),
                "claimed_by": None,
                "lease_expires_at": None,
                "completed_at": None,
                "returned_at": None,
                "detail": None,
                **fields,
            }
            self.evictions[eviction_id] = eviction
            self._mark(eviction_id)
            return eviction

    def close(self) -> None:
        """Answer every waiting long-poll now (the server is going away)."""
        with self._lock:
            self._closing = True
            self._changed.notify_all()

    def _mark(self, eviction_id: int) -> None:
        """Record a change of the eviction (the caller holds the lock) and wake the long-polls."""
        self.cursor += 1
        self._changed_at[eviction_id] = self.cursor
        self._changed.notify_all()

    def changes(self) -> list[tuple[str, str, Any]]:
        """The calls that change something (everything but GETs)."""
        return [call for call in self.calls if call[0] != "GET"]

    def handle(self, method: str, url: str, token: str | None, body: Any) -> tuple[int, Any]:
        parts = urlsplit(url)
        with self._lock:
            self.calls.append((method, parts.path, body))
            who = self.tokens.get(token or "")
            if who is None:
                return 401, {"error_code": "unauthenticated", "message": "bad token"}
            if method == "GET" and parts.path == "/v1/evictions":
                return self._list(parse_qs(parts.query))
            if method != "POST":
                return 405, {"message": "method not allowed"}
            match = re.fullmatch(r"/v1/evictions/(\d+)/(ack|complete|reject)", parts.path)
            if match:
                return self._transition(int(match[1]), match[2], who, body or {})
            match = re.fullmatch(r"/v1/nodes/([^/]+)/return", parts.path)
            if match:
                return self._return(unquote(match[1]), body or {})
            return 404, {"message": f"no route {parts.path}"}

    def _list(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        states = set(query.get("state", []))
        limit = int(query.get("limit", ["100"])[0])
        after = int(query.get("changed_after", ["-1"])[0])
        deadline = time.monotonic() + float(query.get("wait", ["0"])[0])
        while True:
            cursor = self.cursor
            data = [
                dict(e)
                for e in self.evictions.values()
                if (not states or e["state"] in states) and self._changed_at[e["id"]] > after
            ][:limit]
            remaining = deadline - time.monotonic()
            if data or remaining <= 0 or self._closing:
                return 200, {"count": len(data), "data": data, "cursor": cursor}
            self.waiting += 1
            self._changed.wait(remaining)  # releases the lock while it waits
            self.waiting -= 1

    def _transition(self, eviction_id: int, action: str, who: str, body: Any) -> tuple[int, Any]:
        eviction = self.evictions.get(eviction_id)
        if eviction is None:
            return 404, {"message": "no such eviction"}
        if action == "ack":
            if eviction["state"] == "acked" and eviction["claimed_by"] not in (None, who):
                return 409, {"message": f"claimed by {eviction['claimed_by']}"}
            if eviction["state"] not in ("pending", "acked"):
                return 409, {"message": f"eviction is {eviction['state']}"}
            eviction.update(state="acked", claimed_by=who, lease_expires_at=_now())
        elif eviction["claimed_by"] != who or eviction["state"] != "acked":
            return 409, {"message": "ack it first"}
        elif action == "complete":
            eviction.update(state="completed", completed_at=_now())
        else:
            eviction.update(state="rejected", detail=body.get("reason"))
        eviction["updated_at"] = _now()
        self._mark(eviction_id)
        return 200, dict(eviction)

    def _return(self, node: str, body: Any) -> tuple[int, Any]:
        done = [
            e for e in self.evictions.values() if e["node"] == node and e["state"] == "completed"
        ]
        if not done:
            return 404, {"message": f"node {node} has no completed eviction"}
        if node in self.unvalidated:
            return 409, {"message": self.unvalidated[node]}
        for eviction in done:
            eviction.update(state="returned", returned_at=_now(), detail=body.get("note"))
            self._mark(eviction["id"])
        return 200, {"node": node, "returned": [e["id"] for e in done]}


class _Handler(BaseHTTPRequestHandler):
    api: FakeSchedulerApi

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        status, answer = self.api.handle(self.command, self.path, token, body)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _serve


@contextmanager
def serve_fake_api(api: FakeSchedulerApi | None = None) -> Iterator[FakeSchedulerApi]:
    """Serve ``api`` on 127.0.0.1 (a free port) for the block; ``api.url`` is its base URL."""
    api = api or FakeSchedulerApi()
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        api.close()
        server.shutdown()
        server.server_close()
        thread.join()
