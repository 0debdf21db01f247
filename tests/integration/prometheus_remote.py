"""Real Prometheus servers that scrape captured dcgm-exporter pages and remote-write what they
scrape, for the live remote-write tests.

The pages are real exporters' output (shared/fixtures/dcgm_exporter/metrics), served by a small
threaded HTTP server whose page a test can switch while Prometheus scrapes it (a GPU's last Xid
turning 79, as dcgm-exporter shows a fallen GPU). Prometheus is Debian's ``/usr/bin/prometheus``
with a config built here: a 1 s scrape of every page and one ``remote_write`` with a bearer token,
its queue tuned to send within a second and retry within a second (the defaults wait 5 s and
back off up to 5 s, which a test would sit through after every outage). What Prometheus itself
holds is read back from its HTTP API, to compare with what the receiver stored.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.integration.live import free_port, stop_process

__all__ = [
    "DCGM_PAGES",
    "Exporter",
    "Prometheus",
    "exporter",
    "prometheus",
    "remote_write_config",
    "with_last_xid",
]

DCGM_PAGES = Path(__file__).resolve().parents[2].parent / "shared/fixtures/dcgm_exporter/metrics"


class Exporter:
    """A dcgm-exporter stand-in on a loopback ``address``: ``/metrics`` answers with
    :attr:`page`, which a test may replace at any time (the handler threads read it once per
    request)."""

    def __init__(self, page: str, address: str = "127.0.0.1") -> None:
        self.page = page
        self.scrapes = 0  # requests answered, so a test can wait for Prometheus to come by
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # Prometheus asks every second: the test's output is no place for that

            def do_GET(self) -> None:
                found = self.path.split("?", 1)[0] == "/metrics"
                payload = exporter.page.encode() if found else b"not found\n"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                exporter.scrapes += found

        self._server = ThreadingHTTPServer((address, free_port()), Handler)
        self._server.daemon_threads = True
        self.target = f"{address}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def exporter(page: str, address: str = "127.0.0.1") -> Iterator[Exporter]:
    """An :class:`Exporter` serving ``page`` on ``address``, stopped on exit."""
    served = Exporter(page, address)
    served.start()
    try:
        yield served
    finally:
        served.close()


def with_last_xid(page: str, uuid: str, code: int) -> str:
    """``page`` with the whole-GPU ``DCGM_FI_DEV_XID_ERRORS`` series of GPU ``uuid`` set to
    ``code``, every other line as captured."""
    lines = page.split("\n")
    hits = [
        i
        for i, line in enumerate(lines)
        if line.startswith("DCGM_FI_DEV_XID_ERRORS{")
        and f'UUID="{uuid}"' in line
        and "GPU_I_ID=" not in line
    ]
    if len(hits) != 1:
        raise ValueError(f"{len(hits)} whole-GPU Xid series of {uuid} in the page, not one")
    series = lines[hits[0]].rsplit(" ", 1)[0]
    lines[hits[0]] = f"{series} {code}"
    return "\n".join(lines)


def remote_write_config(
    targets: Sequence[str],
    write_url: str,
    token: str,
    *,
    external_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Prometheus' configuration: every ``targets`` exporter scraped each second, everything
    remote-written to ``write_url`` with ``token`` as its bearer credentials."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": list(targets)}]}],
        "remote_write": [
            {
                "url": write_url,
                "authorization": {"credentials": token},
                "queue_config": {
                    "batch_send_deadline": "1s",
                    "min_backoff": "100ms",
                    "max_backoff": "1s",
                },
            }
        ],
    }
    if external_labels:
        config["global"]["external_labels"] = dict(external_labels)
    return config


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query at the present moment."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def sample_times(self, uuid: str, window_s: int = 600) -> set[int]:
        """Milliseconds since the epoch of every scrape, in the last ``window_s`` seconds,
        from which Prometheus holds a sample of any series of GPU ``uuid`` (labelled ``UUID``,
        or ``uuid`` as dcgm-exporter 1.x did)."""
        series = [
            one
            for label in ("UUID", "uuid")
            for one in self.query(f'{{{label}="{uuid}"}}[{window_s}s]')
        ]
        return {round(float(ts) * 1000) for s in series for ts, _value in s["values"]}

    def values(self, metric: str, uuid: str, window_s: int = 600) -> list[tuple[int, str]]:
        """``metric``'s samples of GPU ``uuid`` (whole-GPU series), oldest first, as
        (milliseconds since the epoch, value as Prometheus prints it)."""
        series = self.query(f'{metric}{{UUID="{uuid}",GPU_I_ID=""}}[{window_s}s]')
        points = [(round(float(ts) * 1000), value) for s in series for ts, value in s["values"]]
        return sorted(points)

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")


@contextmanager
def prometheus(binary: str, config: Mapping[str, Any], work_dir: Path) -> Iterator[Prometheus]:
    """Prometheus (``binary``) running ``config``, its TSDB and log in ``work_dir``, ready;
    stopped on exit."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config_file = work_dir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    log = work_dir / "prometheus.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=info",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    running = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 120  # generous: CI has 2 shared cores
        while True:
            running.alive()
            try:
                if httpx.get(f"{running.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield running
    finally:
        # On SIGTERM it flushes its remote-write queue for up to a minute when the receiver
        # is gone; nothing it still holds matters to a test that is over.
        stop_process(process, timeout=10)
