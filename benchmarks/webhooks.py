"""Webhook delivery: outbox throughput and alert-to-receipt latency against a local receiver.

A receiver (``http.server``, threaded, in its own process so it does not share our interpreter
lock) records when each ``Idempotency-Key`` arrives. Against it:

* ``ceiling``: a tight loop of signed-size httpx POSTs, sequential and with ``--concurrency``
  threads: what the receiver and loopback allow at all;
* ``burst``: ``--alerts`` alerts (default 2,000) and their outbox rows created at once, drained by
  :class:`fleetwatch.server.tell.outbox.OutboxWorker` exactly as the server's job runs it (claim a
  batch of 256, send ``webhook_concurrency`` at a time, record outcomes): deliveries/s, and the
  latency from each alert's creation to its receipt;
* ``steady``: ``--steady`` alerts created one at a time at ``--rate``/s, each pass of the alert job
  poking the worker as the server does: creation-to-receipt latency p50/p99.

    .venv/bin/python benchmarks/webhooks.py [--alerts 2000] [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
from sqlalchemy import insert

from fleetwatch.config import ServerSettings
from fleetwatch.notify.webhooks import alert_document
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import alerts, metadata, webhook_subscriptions
from fleetwatch.server.repo.webhooks import enqueue
from fleetwatch.server.tell.outbox import OutboxWorker


def _serve(port_queue: Any) -> None:
    arrivals: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else 40 ms delayed ACKs per keep-alive request

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            arrivals.setdefault(self.headers.get("Idempotency-Key", ""), time.time())
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(arrivals).encode()
            arrivals.clear()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_queue.put(server.server_address[1])
    server.serve_forever()


def _doc(alert_id: int, now: datetime) -> dict[str, Any]:
    return alert_document(
        {
            "id": alert_id,
            "dedup_key": f"gpu:GPU-{alert_id}:xid79",
            "state": "firing",
            "kind": "xid",
            "severity": "fatal",
            "node": f"node-{alert_id % 500:03d}",
            "gpu_uuid": f"GPU-{alert_id}",
            "serial": f"16500{alert_id:05d}",
            "slot": "0000:1b:00.0",
            "cluster": "a",
            "summary": "xid79 on node GPU 3: GPU has fallen off the bus",
            "action": "reboot_node",
            "evidence": {"rule": "xid79", "gpu_index": 3, "xids": [79]},
            "occurrences": 1,
            "started_at": now,
            "updated_at": now,
            "resolved_at": None,
        }
    )


def _create(db: Database, sub_id: int, n: int, tag: str) -> dict[str, float]:
    """``n`` alerts and their deliveries in one transaction; key -> creation time."""
    created = {}
    with db.write() as conn:
        for _ in range(n):
            now = datetime.now(UTC)
            alert_id = conn.execute(
                insert(alerts)
                .values(
                    dedup_key=f"bench:{tag}:{time.perf_counter_ns()}",
                    state="firing",
                    kind="xid",
                    severity="fatal",
                    summary="bench",
                    occurrences=1,
                    started_at=now,
                    updated_at=now,
                    evidence={},
                )
                .returning(alerts.c.id)
            ).scalar_one()
            key = f"trigger:s{sub_id}:a{alert_id}"
            enqueue(
                conn,
                subscription_id=sub_id,
                alert_id=alert_id,
                event="trigger",
                key=key,
                payload={"alerts": [_doc(alert_id, now)]},
                now=now,
            )
            created[key] = now.timestamp()
    return created


def _latencies(receiver: str, created: dict[str, float]) -> np.ndarray:
    arrivals = httpx.get(receiver, timeout=30).json()
    missing = set(created) - set(arrivals)
    assert not missing, f"{len(missing)} deliveries never arrived"
    return np.array([arrivals[k] - created[k] for k in created]) * 1000.0


def _ceiling(receiver: str, n: int, concurrency: int) -> tuple[float, float]:
    body = json.dumps(
        {"idempotency_key": "x", "event": "trigger", "alert": _doc(1, datetime.now(UTC))}
    ).encode()
    with httpx.Client(timeout=10) as client:
        started = time.perf_counter()
        for i in range(n):
            client.post(receiver, content=body, headers={"Idempotency-Key": f"c{i}"})
        sequential = n / (time.perf_counter() - started)
        with ThreadPoolExecutor(concurrency) as pool:
            started = time.perf_counter()
            list(
                pool.map(
                    lambda i: client.post(
                        receiver, content=body, headers={"Idempotency-Key": f"p{i}"}
                    ),
                    range(n),
                )
            )
            parallel = n / (time.perf_counter() - started)
    httpx.get(receiver, timeout=30)  # clear
    return sequential, parallel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=2000)
    parser.add_argument("--steady", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="steady alerts per second")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.alerts, args.steady, args.rate = 20, 5, 50.0

    ports: Any = multiprocessing.Queue()
    child = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    child.start()
    receiver = f"http://127.0.0.1:{ports.get(timeout=10)}/hook"
    tmp = tempfile.TemporaryDirectory()
    url = args.database_url or f"sqlite:///{tmp.name}/bench.db"
    settings = ServerSettings(
        database_url=url,
        webhook_concurrency=args.concurrency,  # type: ignore[call-arg]
        _env_file=None,
    )
    db = Database(make_engine(settings))
    upgrade(db.engine)
    with db.write() as conn:
        for table in (
            t
            for t in reversed(metadata.sorted_tables)
            if t.name in ("webhook_outbox", "alerts", "webhook_subscriptions")
        ):
            conn.execute(table.delete())
        sub_id = conn.execute(
            insert(webhook_subscriptions)
            .values(
                name="bench",
                kind="generic",
                url=receiver,
                secret="k",
                filters={},
                enabled=True,
                created_at=datetime.now(UTC),
            )
            .returning(webhook_subscriptions.c.id)
        ).scalar_one()
    print(
        f"database: {db.engine.dialect.name}; receiver {receiver}; concurrency {args.concurrency}"
    )

    seq, par = _ceiling(receiver, args.alerts, args.concurrency)
    print(
        f"ceiling: {seq:,.0f} posts/s sequential, "
        f"{par:,.0f} posts/s with {args.concurrency} threads"
    )

    worker = OutboxWorker(db, settings)
    created = _create(db, sub_id, args.alerts, "burst")
    started = time.perf_counter()
    delivered = 0
    while delivered < args.alerts:
        delivered += worker.run_once().delivered
    elapsed = time.perf_counter() - started
    lat = _latencies(receiver, created)
    print(
        f"burst: {args.alerts} deliveries in {elapsed:.2f} s = {args.alerts / elapsed:,.0f}/s; "
        f"creation->receipt p50 {np.percentile(lat, 50):,.0f} ms, "
        f"p99 {np.percentile(lat, 99):,.0f} ms"
    )

    wake = threading.Event()
    stop = threading.Event()

    def loop() -> None:  # the server's periodic() job with its waker, on a 1 s tick
        while not stop.is_set():
            worker.run_once()
            wake.wait(1.0)
            wake.clear()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    created = {}
    for _ in range(args.steady):
        created.update(_create(db, sub_id, 1, "steady"))
        wake.set()  # the alert job's on_queued
        time.sleep(1.0 / args.rate)
    time.sleep(1.5)
    stop.set()
    wake.set()
    thread.join()
    lat = _latencies(receiver, created)
    print(
        f"steady: {args.steady} alerts at {args.rate:g}/s; creation->receipt p50 "
        f"{np.percentile(lat, 50):,.1f} ms, p99 {np.percentile(lat, 99):,.1f} ms, "
        f"max {lat.max():,.1f} ms"
    )
    worker.close()
    worker.client.close()  # close() leaves the client it made open
    db.dispose()
    tmp.cleanup()
    child.terminate()
    child.join()


if __name__ == "__main__":
    main()
