"""Report a training job's step times to FleetWatch without slowing the training loop.

::

    from fleetwatch.client import StepReporter

    with StepReporter("http://fleetwatch:8400", token, job_id="llm-42", rank=rank,
                      node=socket.gethostname()) as reporter:
        for step in range(steps):
            with reporter.timed(step):
                train_step()

The token is an **agent**-scope token (``fleetwatch token create --scope agent``). ``step()`` and
``timed()`` only append to a bounded in-memory queue (microseconds); a daemon thread posts batches
to ``POST /v1/jobs/{job_id}/steps`` every ``flush_interval_s``. Nothing here raises into the
training loop: while the server is away the thread retries with exponential backoff (up to 60 s)
and the queue keeps the newest ``max_queue`` steps, dropping the oldest (``dropped`` counts them).
A batch the server refuses (4xx other than 408/429) is dropped and counted in ``rejected``.
``close()`` (and leaving the ``with`` block) flushes for at most ``close_timeout_s``.

Only the standard library and httpx are imported, so the agent-only install can use it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import httpx

__all__ = ["StepReporter"]

logger = logging.getLogger(__name__)

MAX_BATCH = 5000
MAX_BACKOFF_S = 60.0
_RETRY_STATUSES = {408, 429}


class StepReporter:
    """Queues this rank's step durations and sends them from a background thread."""

    def __init__(
        self,
        url: str,
        token: str,
        job_id: str,
        rank: int,
        node: str,
        *,
        flush_interval_s: float = 2.0,
        max_queue: int = 10_000,
        stage: int | None = None,
        dp_group: int | None = None,
        timeout_s: float = 5.0,
        close_timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.job_id = job_id
        self.rank = rank
        self.node = node
        self.stage = stage
        self.dp_group = dp_group
        self.flush_interval_s = flush_interval_s
        self.close_timeout_s = close_timeout_s
        self.sent = 0
        self.dropped = 0
        self.rejected = 0
        self._queue: deque[dict[str, Any]] = deque()
        self._max_queue = max_queue
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._next_step = 0
        self._path = f"/v1/jobs/{job_id}/steps"
        self._client = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )
        self._healthy = True
        self._thread = threading.Thread(target=self._run, name="fleetwatch-steps", daemon=True)
        self._thread.start()

    # -- the training loop's side: never blocks on the network, never raises -----------------

    def step(self, step: int, duration_ms: float) -> None:
        """Record that ``step`` took ``duration_ms`` on this rank, ending now."""
        item = {
            "rank": self.rank,
            "node": self.node,
            "step": int(step),
            "duration_ms": float(duration_ms),
            "ts": datetime.now(UTC).isoformat(),
        }
        if self.stage is not None:
            item["stage"] = self.stage
        if self.dp_group is not None:
            item["dp_group"] = self.dp_group
        with self._lock:
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(item)
            self._next_step = int(step) + 1

    @contextmanager
    def timed(self, step: int | None = None) -> Iterator[None]:
        """Time the block as one step (numbered after the previous one unless given)."""
        number = self._next_step if step is None else step
        started = time.perf_counter()
        try:
            yield
        finally:
            self.step(number, (time.perf_counter() - started) * 1000.0)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued, waiting at most ``timeout_s`` (default ``close_timeout_s``)."""
        self._closing.set()
        self._wake.set()
        self._thread.join(self.close_timeout_s if timeout_s is None else timeout_s)
        if self._thread.is_alive():
            logger.warning("step reporter: %d steps not sent before close timed out", self.pending)
        else:
            self._client.close()

    def __enter__(self) -> StepReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the sender thread -------------------------------------------------------------------

    def _take(self) -> list[dict[str, Any]]:
        with self._lock:
            count = min(len(self._queue), MAX_BATCH)
            return [self._queue.popleft() for _ in range(count)]

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        # The failed batch is older than anything queued since; the oldest go first when full.
        with self._lock:
            room = self._max_queue - len(self._queue)
            keep = batch[-room:] if room > 0 else []
            self.dropped += len(batch) - len(keep)
            self._queue.extendleft(reversed(keep))

    def _send(self, batch: list[dict[str, Any]]) -> bool:
        """True when the batch is done with (stored or refused for good)."""
        try:
            response = self._client.post(self._path, json={"steps": batch})
        except httpx.HTTPError as exc:
            self._set_health(False, f"{type(exc).__name__}: {exc}")
            return False
        status = response.status_code
        if status < 300:
            self.sent += len(batch)
            self._set_health(True, "")
            return True
        if status >= 500 or status in _RETRY_STATUSES:
            self._set_health(False, f"HTTP {status}")
            return False
        self.rejected += len(batch)
        logger.error(
            "step reporter: server refused %d steps (HTTP %d): %s",
            len(batch),
            status,
            response.text[:500],
        )
        return True

    def _set_health(self, healthy: bool, reason: str) -> None:
        if healthy != self._healthy:
            if healthy:
                logger.info("step reporter: server reachable again")
            else:
                logger.warning("step reporter: cannot send steps (%s); retrying", reason)
        self._healthy = healthy

    def _run(self) -> None:
        backoff = self.flush_interval_s
        deadline: float | None = None
        while True:
            closing = self._closing.is_set()
            if closing and deadline is None:
                deadline = time.monotonic() + self.close_timeout_s
            batch = self._take()
            if not batch:
                if closing:
                    return
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
                continue
            try:
                done = self._send(batch)
            except Exception:  # the thread must survive anything; the loop never sees it
                logger.exception("step reporter: unexpected error; dropping %d steps", len(batch))
                self.dropped += len(batch)
                done = True
            if done:
                backoff = self.flush_interval_s
                if self.pending < MAX_BATCH and not closing:
                    self._wake.wait(self.flush_interval_s)
                    self._wake.clear()
                continue
            self._requeue(batch)
            if deadline is not None:
                if time.monotonic() >= deadline:
                    return
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
                continue
            self._wake.wait(backoff * random.uniform(0.8, 1.2))
            self._wake.clear()
            backoff = min(backoff * 2, MAX_BACKOFF_S)
