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

The job's own story goes the same way, queued and sent by the same thread (to
``POST /v1/jobs/{job_id}/start | end | checkpoints | restarts``)::

    reporter.start(ranks=world_size)            # this rank's node is added to the job's nodes
    with reporter.checkpoint(step=step):        # records when it began and how long it took
        save_checkpoint()
    reporter.restarted(from_step=1000, lost_steps=150, interrupted_at=when_it_died)
    reporter.end("completed")                   # or "failed" / "cancelled", with a reason

These keep at most ``max_events`` reports (the oldest go first: ``dropped_events``), and a report
the server refuses is counted in ``rejected_events``; a bad argument is logged and dropped, never
raised. The server keys a checkpoint by its start and a restart by its resume time, so a report
sent twice is stored once.

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
OUTCOMES = ("completed", "failed", "cancelled")
Work = tuple[str, Any]  # ("steps", [step, ...]) or ("event", (path, body))


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
        max_events: int = 1000,
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
        self.sent_events = 0
        self.dropped_events = 0
        self.rejected_events = 0
        self._events: deque[tuple[str, dict[str, Any]]] = deque()
        self._max_events = max_events
        self._queue: deque[dict[str, Any]] = deque()
        self._max_queue = max_queue
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._next_step = 0
        self._path = f"/v1/jobs/{job_id}/steps"
        self._job_path = f"/v1/jobs/{job_id}"
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

    def start(
        self,
        *,
        nodes: list[str] | None = None,
        ranks: int | None = None,
        started_at: datetime | None = None,
    ) -> None:
        """The job started (now, unless given) on ``nodes`` (default: this rank's node)."""
        body: dict[str, Any] = {
            "started_at": _instant(started_at),
            "nodes": list(nodes) if isinstance(nodes, list | tuple) and nodes else [self.node],
        }
        if ranks is not None:
            body["ranks"] = ranks
        self._event("start", body)

    def end(
        self, outcome: str, *, reason: str | None = None, ended_at: datetime | None = None
    ) -> None:
        """The job ended (now, unless given): ``completed``, ``failed`` or ``cancelled``."""
        if outcome not in OUTCOMES:
            logger.error("step reporter: outcome %r is not one of %s; not sent", outcome, OUTCOMES)
            return
        body: dict[str, Any] = {"outcome": outcome, "ended_at": _instant(ended_at)}
        if reason is not None:
            body["reason"] = str(reason)[:1000]
        self._event("end", body)

    @contextmanager
    def checkpoint(self, step: int | None = None) -> Iterator[None]:
        """Time the block as one checkpoint; one that raises is not reported (its error is
        the training code's own, and goes on up)."""
        began = datetime.now(UTC)
        started = time.perf_counter()
        yield
        body: dict[str, Any] = {
            "started_at": began.isoformat(),
            "duration_s": time.perf_counter() - started,
        }
        if step is not None:
            body["step"] = step
        self._event("checkpoints", body)

    def restarted(
        self,
        *,
        from_step: int | None = None,
        lost_steps: int | None = None,
        interrupted_at: datetime | None = None,
        lost_s: float | None = None,
        resumed_at: datetime | None = None,
    ) -> None:
        """The job resumed (now, unless given) from the checkpoint of ``from_step``, redoing
        ``lost_steps`` steps (or ``lost_s`` seconds) of work; ``interrupted_at`` is when it had
        stopped, which gives the time to recover."""
        body: dict[str, Any] = {"resumed_at": _instant(resumed_at)}
        extra = {"from_step": from_step, "lost_steps": lost_steps, "lost_s": lost_s}
        body.update({k: v for k, v in extra.items() if v is not None})
        if interrupted_at is not None:
            body["interrupted_at"] = _instant(interrupted_at)
        self._event("restarts", body)

    def _event(self, what: str, body: dict[str, Any]) -> None:
        # Values are checked by the server (a refusal is counted in rejected_events), so that a
        # wrong argument never raises into the training loop.
        with self._lock:
            if len(self._events) >= self._max_events:
                self._events.popleft()
                self.dropped_events += 1
            self._events.append((f"{self._job_path}/{what}", body))
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def pending_events(self) -> int:
        with self._lock:
            return len(self._events)

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued, waiting at most ``timeout_s`` (default ``close_timeout_s``)."""
        self._closing.set()
        self._wake.set()
        self._thread.join(self.close_timeout_s if timeout_s is None else timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "step reporter: %d steps and %d job reports not sent before close timed out",
                self.pending,
                self.pending_events,
            )
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

    def _take(self) -> Work | None:
        """The next work: a job report first (a start precedes the steps), else a step batch."""
        with self._lock:
            if self._events:
                return ("event", self._events.popleft())
            count = min(len(self._queue), MAX_BATCH)
            if not count:
                return None
            return ("steps", [self._queue.popleft() for _ in range(count)])

    def _give_back(self, work: Work) -> None:
        kind, payload = work
        if kind == "steps":
            self._requeue(payload)
            return
        with self._lock:
            if len(self._events) >= self._max_events:
                self.dropped_events += 1  # the newer ones are kept
                return
            self._events.appendleft(payload)

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        # The failed batch is older than anything queued since; the oldest go first when full.
        with self._lock:
            room = self._max_queue - len(self._queue)
            keep = batch[-room:] if room > 0 else []
            self.dropped += len(batch) - len(keep)
            self._queue.extendleft(reversed(keep))

    def _send(self, work: Work) -> bool:
        """True when the work is done with (stored or refused for good)."""
        kind, payload = work
        path, body = (self._path, {"steps": payload}) if kind == "steps" else payload
        try:
            response = self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            self._set_health(False, f"{type(exc).__name__}: {exc}")
            return False
        status = response.status_code
        if status < 300:
            if kind == "steps":
                self.sent += len(payload)
            else:
                self.sent_events += 1
            self._set_health(True, "")
            return True
        if status >= 500 or status in _RETRY_STATUSES:
            self._set_health(False, f"HTTP {status}")
            return False
        what = f"{len(payload)} steps" if kind == "steps" else f"a report to {path}"
        if kind == "steps":
            self.rejected += len(payload)
        else:
            self.rejected_events += 1
        logger.error(
            "step reporter: server refused %s (HTTP %d): %s", what, status, response.text[:500]
        )
        return True

    def _drop(self, work: Work) -> None:
        kind, payload = work
        if kind == "steps":
            self.dropped += len(payload)
        else:
            self.dropped_events += 1

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
            work = self._take()
            if work is None:
                if closing:
                    return
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
                continue
            try:
                done = self._send(work)
            except Exception:  # the thread must survive anything; the loop never sees it
                logger.exception("step reporter: unexpected error; dropping %s", work[0])
                self._drop(work)
                done = True
            if done:
                backoff = self.flush_interval_s
                busy = self.pending >= MAX_BATCH or self.pending_events > 0
                if not busy and not closing:
                    self._wake.wait(self.flush_interval_s)
                    self._wake.clear()
                continue
            self._give_back(work)
            if deadline is not None:
                if time.monotonic() >= deadline:
                    return
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
                continue
            self._wake.wait(backoff * random.uniform(0.8, 1.2))
            self._wake.clear()
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def _instant(ts: datetime | None) -> Any:
    """``ts`` (now when None) as ISO 8601 with an offset; a naive time is taken as UTC. Anything
    else is sent as it is, for the server to refuse."""
    if ts is None:
        return datetime.now(UTC).isoformat()
    if not isinstance(ts, datetime):
        return str(ts)
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).isoformat()
