"""Pushing spooled batches to the server, in order, until each is acknowledged.

What the server answers decides a batch's fate:

- 200: committed (or a duplicate of a committed batch) -> remove it from the spool;
- 5xx, 408, 429, a timeout, no connection -> keep it, back off exponentially with full jitter;
- 401/403: our token is wrong or revoked -> keep it (nothing is lost while an operator fixes the
  token), back off, log an ERROR once;
- any other 4xx: the server will never take this body -> move it out of the spool into
  ``rejected/`` with the server's answer (logged as an ERROR: data an operator must look at),
  so that one bad batch cannot block every later one;
- 422 naming only optional fields newer than the server (``gpus.N.mig``): the server is older
  than the agent -> send the batch again at once without them (:mod:`fleetwatch.agent.wire_compat`)
  and treat that answer as above; a WARNING once says to upgrade the server;
- a plain 500 for the same batch, at least ``poison_attempts`` times over at least
  ``poison_after_s``, while the server takes other batches: the batch is poisoned (see
  :mod:`fleetwatch.agent.poison`) -> set aside into ``rejected/`` like a refused one, counted, and
  reported to the server by a ``batch_set_aside`` event in a later batch. 502/503/504/507 and
  transport errors are an outage and never set a batch aside.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetwatch.agent.poison import POISON_STATUS, FailureLog
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import SetAside, Spool, SpooledBatch
from fleetwatch.agent.wire_compat import refuses_only_newer_fields, without_newer_fields

__all__ = ["Backoff", "Pusher"]

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 425, 429})
_AUTH_STATUSES = frozenset({401, 403})
IDLE_S = 5.0  # wait when the spool is empty (a new batch wakes the pusher at once)


class _Outcome(enum.Enum):
    ACKED = "acked"
    REJECTED = "rejected"  # moved out of the spool
    FAILED = "failed"  # kept, to retry


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
        poison_after_s: float = 600.0,
        poison_attempts: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._spool = spool
        self._metrics = metrics
        self._rejected_dir = rejected_dir
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._failures = FailureLog(
            after_s=poison_after_s, min_attempts=poison_attempts, clock=clock
        )
        self._wake = threading.Event()
        self._auth_error_logged = False
        self._older_server_logged = False
        self._last_status: int | None = None  # of the last push; None: no answer
        self.pushed_batches = 0

    def close(self) -> None:
        """Close the HTTP client (its kept-alive connection to the server)."""
        self._client.close()

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
                return IDLE_S
            if self._push(batch) is _Outcome.FAILED:
                suspect = self._failures.suspect(batch.batch_id)
                if not (suspect and self._set_aside_if_poisoned(batch)):
                    delay = self._backoff.next_delay(self._rng)
                    logger.debug("push failed; retrying in %.2fs", delay)
                    return delay
            self._backoff.reset()
        return 0.0

    # -- one batch --------------------------------------------------------------------------

    def _push(self, batch: SpooledBatch) -> _Outcome:
        started = time.perf_counter()
        self._last_status = None
        try:
            response = self._post(batch.body)
            if refuses_only_newer_fields(response):
                reduced = without_newer_fields(batch.body)
                if reduced is not None:
                    self._note_older_server(response)
                    response = self._post(reduced)
        except httpx.HTTPError as exc:
            self._metrics.push_failures.labels("transport").inc()
            logger.warning("push of %s failed: %s", batch.batch_id, exc)
            return _Outcome.FAILED
        self._metrics.push_latency.observe(time.perf_counter() - started)
        status = self._last_status = response.status_code
        if status == 200:
            self._spool.ack(batch.seq)
            self._failures.forget(batch.batch_id)
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
            return _Outcome.ACKED
        self._metrics.push_failures.labels(str(status)).inc()
        if status == POISON_STATUS:
            self._failures.record(batch.batch_id, f"{status}\n{response.text}")
        if status >= 500 or status in _RETRY_STATUSES:
            logger.warning("server answered %d for %s; will retry", status, batch.batch_id)
            return _Outcome.FAILED
        if status in _AUTH_STATUSES:
            if not self._auth_error_logged:
                logger.error(
                    "server refused our token (%d: %s); keeping batches until it is fixed",
                    status,
                    _error_text(response),
                )
                self._auth_error_logged = True
            return _Outcome.FAILED
        self._reject(batch, response)
        return _Outcome.REJECTED

    def _post(self, body: bytes) -> httpx.Response:
        return self._client.post(
            "/v1/ingest",
            content=body,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    def _note_older_server(self, response: httpx.Response) -> None:
        if not self._older_server_logged:
            logger.warning(
                "the server is older than this agent (it answered: %s); sending batches without "
                "the fields it does not know (the GPUs' MIG layout, adapter ports), GPU readings "
                "kept; upgrade the server to keep them",
                _error_text(response),
            )
            self._older_server_logged = True

    def _reject(self, batch: SpooledBatch, response: httpx.Response) -> None:
        self._keep_for_inspection(batch, f"{response.status_code}\n{response.text}\n")
        self._spool.reject(batch.seq)
        self._failures.forget(batch.batch_id)
        self._metrics.rejected_batches.inc()
        logger.error(
            "server rejected batch %s (%d: %s); kept in %s for inspection",
            batch.batch_id,
            response.status_code,
            _error_text(response),
            self._rejected_dir,
        )

    # -- a poisoned batch -------------------------------------------------------------------

    def _set_aside_if_poisoned(self, batch: SpooledBatch) -> bool:
        """For a suspect batch: if the server takes others, one last try, then set it aside.
        ``True`` when the batch is out of the way (or went through after all)."""
        if not self._server_takes_others():
            return False
        outcome = self._push(batch)
        if outcome is not _Outcome.FAILED:
            return True
        failures = self._failures.get(batch.batch_id)
        if self._last_status != POISON_STATUS or failures is None:
            return False  # the last answer was an outage after all: keep it
        failing_s = self._failures.failing_s(batch.batch_id)
        answer = failures.answer
        self._keep_for_inspection(
            batch,
            f"{answer}\n\nset aside after {failures.attempts} answers of {POISON_STATUS} "
            f"over {failing_s:.0f} s while the server took other batches\n",
        )
        self._spool.set_aside(
            batch.seq,
            SetAside(
                batch_id=batch.batch_id,
                at=time.time(),
                status=POISON_STATUS,
                attempts=failures.attempts,
                failing_s=round(failing_s, 3),
                samples=batch.samples,
                events=batch.events,
                answer=_short(answer.partition("\n")[2]),
            ),
        )
        self._failures.forget(batch.batch_id)
        self._metrics.set_aside_batches.inc()
        logger.error(
            "set aside batch %s: the server answered %d to it %d times over %.0f s while taking "
            "other batches (%s); kept in %s for inspection",
            batch.batch_id,
            POISON_STATUS,
            failures.attempts,
            failing_s,
            _short(answer.partition("\n")[2]),
            self._rejected_dir,
        )
        return True

    def _server_takes_others(self) -> bool:
        """The server acknowledges the next batch behind the head (refused ones are moved aside
        and the next tried), or, with none behind it, answers ``/readyz`` with 200."""
        while (other := self._spool.next(skip=1)) is not None:
            outcome = self._push(other)
            if outcome is _Outcome.ACKED:
                return True
            if outcome is _Outcome.FAILED:
                return False
        try:
            return self._client.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _keep_for_inspection(self, batch: SpooledBatch, answer: str) -> None:
        self._rejected_dir.mkdir(parents=True, exist_ok=True)
        stem = self._rejected_dir / batch.batch_id
        stem.with_suffix(".json.gz").write_bytes(batch.body)
        stem.with_suffix(".error.txt").write_text(answer)


def _short(text: str) -> str:
    return text.strip()[:300]


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", response.text))[:300]
    except ValueError:
        return response.text[:300]
