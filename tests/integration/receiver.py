"""A real HTTP webhook receiver for live tests: it records every delivery as it arrives and can
hold chosen ones unanswered, so that a test can kill the sender while a delivery is in flight.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleetwatch.notify.webhooks import verify_signature

__all__ = ["Delivery", "WebhookReceiver", "webhook_receiver"]


@dataclass(frozen=True)
class Delivery:
    key: str  # the Idempotency-Key header
    event: str  # trigger | resolve | ...
    node: str | None
    alert_id: int | None
    signed: bool  # the signature checks out with the receiver's secret
    doc: dict[str, Any] = field(default_factory=dict, compare=False)  # the whole JSON body

    @classmethod
    def parse(cls, headers: dict[str, str], body: bytes, secret: str) -> Delivery:
        doc = json.loads(body)
        alert = doc.get("alert") or {}
        signed = verify_signature(
            secret,
            headers.get("X-FleetWatch-Timestamp", ""),
            body,
            headers.get("X-FleetWatch-Signature", ""),
        )
        return cls(
            key=headers.get("Idempotency-Key", ""),
            event=str(doc.get("event")),
            node=alert.get("node"),
            alert_id=alert.get("id"),
            signed=signed,
            doc=doc,
        )


class WebhookReceiver:
    """Generic-webhook deliveries received (in order of arrival), and a hold on some."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: list[Delivery] = []
        self.held = threading.Event()  # set when a held delivery has arrived
        self._release = threading.Event()
        self._hold: Callable[[Delivery], bool] = lambda _: False
        self._lock = threading.Lock()
        self.url = ""

    def hold(self, which: Callable[[Delivery], bool]) -> None:
        """Leave the first delivery matching ``which`` unanswered until :meth:`release`."""
        self._release.clear()
        self.held.clear()
        self._hold = which

    def release(self) -> None:
        self._hold = lambda _: False
        self._release.set()

    def deliveries(self, node: str, event: str = "trigger") -> list[Delivery]:
        return [d for d in self.events(event) if d.node == node]

    def events(self, event: str) -> list[Delivery]:
        """Every ``event`` delivery (trigger, resolve, ...), of any node."""
        with self._lock:
            return [d for d in self.received if d.event == event]

    def _arrived(self, delivery: Delivery) -> bool:
        """Record it; whether to hold it."""
        with self._lock:
            self.received.append(delivery)
            hold = self._hold(delivery) and not self.held.is_set()
            if hold:
                self.held.set()
        return hold

    def _wait_for_release(self) -> None:
        self._release.wait(300)


def _handler(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            delivery = Delivery.parse(dict(self.headers), body, receiver.secret)
            if receiver._arrived(delivery):
                receiver._wait_for_release()
            try:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:  # the sender died while we held its request
                pass

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def webhook_receiver(secret: str) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(secret)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        server.shutdown()
        server.server_close()
