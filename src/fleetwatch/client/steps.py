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

Notices (issue 15): a second daemon thread long-polls ``GET /v1/jobs/{job_id}/notices`` (the
same token) and keeps what the server tells this job about its nodes: a drain pending, a GPU
out, a node risk over the job's threshold, and their clearing. The loop asks cheaply::

    for step in range(steps):
        with reporter.timed(step):
            train_step()
        if reporter.should_checkpoint():    # a notice arrived since the last checkpoint
            with reporter.checkpoint(step=step):
                save_checkpoint()
            if reporter.exit_advised:        # the node is being drained: leave cleanly
                break

``reporter.notices`` lists every notice received, ``reporter.open_notices`` those still open;
``on_notice`` (a callable taking the notice dict) is called from the background thread, and an
exception it raises is logged, never raised into the loop. The thread remembers its cursor, so
after the server was away it reads what it missed. ``notices=False`` turns it off.

TLS: ``ca_bundle`` (the CA the server's certificate must chain to), ``client_cert`` and
``client_key`` (for a server that requires client certificates), each defaulting to
``FLEETWATCH_CA_BUNDLE``, ``FLEETWATCH_CLIENT_CERT`` and ``FLEETWATCH_CLIENT_KEY``, as for every
FleetWatch client (:mod:`fleetwatch.client_tls`). A file that cannot be read raises
``ConfigError`` here, at construction, not in the training loop.

Only the standard library, httpx and ``fleetwatch.client_tls`` are imported, so the agent-only
install can use it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import httpx

from fleetwatch.client_tls import ClientTls

__all__ = ["StepReporter"]

logger = logging.getLogger(__name__)

MAX_BATCH = 5000
MAX_BACKOFF_S = 60.0
_RETRY_STATUSES = {408, 429}
OUTCOMES = ("completed", "failed", "cancelled")
Work = tuple[str, Any]  # ("steps", [step, ...]) or ("event", (path, body))
Notice = dict[str, Any]
_CHECKPOINT_ACTIONS = ("checkpoint_now", "checkpoint_and_exit")


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
        notices: bool = True,
        on_notice: Callable[[Notice], None] | None = None,
        notice_wait_s: float = 30.0,
        ca_bundle: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
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
        tls = ClientTls.from_env(ca_bundle, client_cert, client_key)
        self._client = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
            verify=tls.verify(),
        )
        self._healthy = True
        self.notices: list[Notice] = []
        self.notice_cursor = 0
        self.on_notice = on_notice
        self._open: dict[int, Notice] = {}
        self._checkpoint_due = threading.Event()
        self._notice_wait_s = notice_wait_s
        self._notice_path = f"/v1/jobs/{job_id}/notices"
        self._thread = threading.Thread(target=self._run, name="fleetwatch-steps", daemon=True)
        self._thread.start()
        self._notice_thread: threading.Thread | None = None
        if notices:
            self._notice_client = httpx.Client(
                base_url=url.rstrip("/"),
                headers={"Authorization": f"Bearer {token}"},
                timeout=notice_wait_s + timeout_s,
                transport=transport,
            )
            self._notice_thread = threading.Thread(
                target=self._watch_notices, name="fleetwatch-notices", daemon=True
            )
            self._notice_thread.start()

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
        notice_risk_threshold: float | None = None,
        horizon_h: float | None = None,
    ) -> None:
        """The job started (now, unless given) on ``nodes`` (default: this rank's node).
        ``notice_risk_threshold`` and ``horizon_h``: when a node's risk gives the job a notice
        (default: the server's settings)."""
        body: dict[str, Any] = {
            "started_at": _instant(started_at),
            "nodes": list(nodes) if isinstance(nodes, list | tuple) and nodes else [self.node],
        }
        extra = {"ranks": ranks, "notice_risk_threshold": notice_risk_threshold}
        body.update({k: v for k, v in extra.items() if v is not None})
        if horizon_h is not None:
            body["horizon_h"] = horizon_h
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
        self._checkpoint_due.clear()  # a checkpoint taken answers the notices before it
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

    def should_checkpoint(self) -> bool:
        """True once after a notice that advises a checkpoint arrived (and again after the next
        one); a checkpoint taken with :meth:`checkpoint` also answers it. No network, no lock."""
        if self._checkpoint_due.is_set():
            self._checkpoint_due.clear()
            return True
        return False

    @property
    def open_notices(self) -> list[Notice]:
        """Notices received and not cleared since, oldest first."""
        with self._lock:
            return list(self._open.values())

    @property
    def exit_advised(self) -> bool:
        """An open notice says checkpoint and exit (the node is being drained)."""
        return any(n.get("action") == "checkpoint_and_exit" for n in self.open_notices)

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
        if self._notice_thread is not None:
            self._notice_thread.join(1.0)  # it checks _closing between polls; a daemon anyway
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

    # -- the notice thread -------------------------------------------------------------------

    def _watch_notices(self) -> None:
        backoff = self.flush_interval_s
        while not self._closing.is_set():
            try:
                got = self._poll_notices()
            except Exception:  # the thread must survive anything; the loop never sees it
                logger.exception("step reporter: unexpected error reading notices")
                got = False
            if got:
                backoff = self.flush_interval_s
                continue
            self._closing.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        self._notice_client.close()

    def _poll_notices(self) -> bool:
        """One long-poll; False when the server could not be asked (then back off)."""
        params = {"after": self.notice_cursor, "wait": self._notice_wait_s}
        try:
            response = self._notice_client.get(self._notice_path, params=params)
        except httpx.HTTPError as exc:
            logger.debug("step reporter: notices not read (%s)", exc)
            return False
        if response.status_code != 200:
            logger.debug("step reporter: notices not read (HTTP %d)", response.status_code)
            return False
        body = response.json()
        for notice in body.get("data", []):
            self._receive(notice)
        self.notice_cursor = max(self.notice_cursor, int(body.get("cursor", 0)))
        return True

    def _receive(self, notice: Notice) -> None:
        with self._lock:
            self.notices.append(notice)
            if notice.get("kind") == "cleared":
                self._open.pop(notice.get("clears") or -1, None)
            elif notice.get("cleared_at") is None:
                self._open[int(notice["id"])] = notice
        if notice.get("cleared_at") is None and notice.get("action") in _CHECKPOINT_ACTIONS:
            self._checkpoint_due.set()
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:  # the job's callback: logged, never raised into its loop
                logger.exception("step reporter: on_notice raised")


def _instant(ts: datetime | None) -> Any:
    """``ts`` (now when None) as ISO 8601 with an offset; a naive time is taken as UTC. Anything
    else is sent as it is, for the server to refuse."""
    if ts is None:
        return datetime.now(UTC).isoformat()
    if not isinstance(ts, datetime):
        return str(ts)
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).isoformat()
