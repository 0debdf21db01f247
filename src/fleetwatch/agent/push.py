"""Pushing spooled batches to the server, in order, until each is acknowledged.

What the server answers decides a batch's fate:

- 200: committed (or a duplicate of a committed batch) -> remove it from the spool;
- 5xx, 408, 429, a timeout, no connection -> keep it, back off exponentially with full jitter;
- 401/403: our token is wrong or revoked -> keep it (nothing is lost while an operator fixes the
  token), back off, log an ERROR once;
- any other 4xx: the server will never take this body -> move it out of the spool into
  ``rejected/`` with the server's answer (logged as an ERROR: data an operator must look at),
  so that one bad batch cannot block every later one.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool, SpooledBatch

__all__ = ["Backoff", "Pusher"]

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 425, 429})
_AUTH_STATUSES = frozenset({401, 403})


@dataclass
class Backoff:
    """Exponential backoff with full jitter: sleep uniform(0, min(cap, base * 2**n))."""

    base_s: float = 0.5
    cap_s: float = 30.0
    failures: int = 0

    def next_delay(self, rng: random.Random) -> float:
        self.failures += 1
        return rng.uniform(0, min(self.cap_s, self.base_s * 2 ** min(self.failures, 20)))

    def reset(self) -> None:
        self.failures = 0


class Pusher:
    """Drains the spool to the server; ``run`` is the pusher thread's body."""

    def __init__(
        self,
        client: httpx.Client,
        spool: Spool,
        metrics: AgentMetrics,
        *,
        rejected_dir: Path,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._spool = spool
        self._metrics = metrics
        self._rejected_dir = rejected_dir
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._wake = threading.Event()
        self._auth_error_logged = False
        self.pushed_batches = 0

    def wake(self) -> None:
        """Something new is in the spool: push now rather than at the next retry."""
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            delay = self.drain(stop)
            self._wake.wait(timeout=delay)
            self._wake.clear()

    def drain(self, stop: threading.Event | None = None) -> float:
        """Push until the spool is empty (returns a long idle wait) or a push fails (returns the
        backoff delay)."""
        while stop is None or not stop.is_set():
            batch = self._spool.next()
            self._metrics.observe_spool(*self._spool.depth())
            if batch is None:
                return 5.0
            if not self._push(batch):
                delay = self._backoff.next_delay(self._rng)
                logger.debug("push failed; retrying in %.2fs", delay)
                return delay
            self._backoff.reset()
        return 0.0

    def _push(self, batch: SpooledBatch) -> bool:
        started = time.perf_counter()
        try:
            response = self._client.post(
                "/v1/ingest",
                content=batch.body,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            self._metrics.push_failures.labels("transport").inc()
            logger.warning("push of %s failed: %s", batch.batch_id, exc)
            return False
        self._metrics.push_latency.observe(time.perf_counter() - started)
        status = response.status_code
        if status == 200:
            self._spool.ack(batch.seq)
            self.pushed_batches += 1
            self._auth_error_logged = False
            self._metrics.pushed_batches.inc()
            self._metrics.last_push.set_to_current_time()
            logger.debug(
                "pushed %s: %d samples, %d events in %.0f ms",
                batch.batch_id,
                batch.samples,
                batch.events,
                (time.perf_counter() - started) * 1000,
            )
            return True
        self._metrics.push_failures.labels(str(status)).inc()
        if status >= 500 or status in _RETRY_STATUSES:
            logger.warning("server answered %d for %s; will retry", status, batch.batch_id)
            return False
        if status in _AUTH_STATUSES:
            if not self._auth_error_logged:
                logger.error(
                    "server refused our token (%d: %s); keeping batches until it is fixed",
                    status,
                    _error_text(response),
                )
                self._auth_error_logged = True
            return False
        self._reject(batch, response)
        return True

    def _reject(self, batch: SpooledBatch, response: httpx.Response) -> None:
        self._rejected_dir.mkdir(parents=True, exist_ok=True)
        stem = self._rejected_dir / batch.batch_id
        stem.with_suffix(".json.gz").write_bytes(batch.body)
        stem.with_suffix(".error.txt").write_text(f"{response.status_code}\n{response.text}\n")
        self._spool.ack(batch.seq)
        self._metrics.rejected_batches.inc()
        logger.error(
            "server rejected batch %s (%d: %s); kept in %s for inspection",
            batch.batch_id,
            response.status_code,
            _error_text(response),
            self._rejected_dir,
        )


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", response.text))[:300]
    except ValueError:
        return response.text[:300]
