"""The thread that stores routine pushes in groups (PostgreSQL): one transaction for the pushes
that wait at one moment (:mod:`fleetwatch.server.ingest.group_store`).

The writer takes every push queued while it stored the last group, then waits up to
``linger_s`` for more before it stores: under load groups grow up to ``max_batches`` (or
``max_rows`` samples). The wait is what makes groups worth having at a steady fleet's load:
a group's statements and commit cost about the same for one push as for ten, so at 100,000
GPUs (about 200 pushes a second) a longer wait is fewer CPU µs a GPU row (the figures per wait:
``ingest_group_linger_ms`` in config, benchmarks/HISTORY.md). A routine push carries no event
(those are stored at once, never grouped), so a quarter second more before its answer delays nothing
anyone waits for. Each push is still answered only after its own group
committed. A push the group leaves out, and every push of a group whose transaction
failed, gets None and is stored on its own by the route, with every answer that path gives
(409, 422, 507, a duplicate).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.ingest.group_store import GroupedBatch, store_group
from fleetwatch.server.ingest.store import IngestResult

__all__ = ["GroupWriter"]

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    item: GroupedBatch
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[IngestResult | None]


def _answer(future: asyncio.Future[IngestResult | None], result: IngestResult | None) -> None:
    if not future.done():  # the request may have gone (client closed, server stopping)
        future.set_result(result)


def _post(pending: _Pending, result: IngestResult | None) -> None:
    """Answer ``pending`` on its event loop; a loop already closed has no one left to answer."""
    try:
        pending.loop.call_soon_threadsafe(_answer, pending.future, result)
    except RuntimeError:
        pass


class GroupWriter:
    """Start once; :meth:`store` from the event loop; :meth:`stop` at shutdown.

    ``on_group(batches, grouped)`` is called after each group with how many pushes it held and
    how many of them it stored (the rest went their own way): for ``/metrics``."""

    def __init__(
        self,
        db: Database,
        *,
        max_batches: int = 64,
        max_rows: int = 8192,
        linger_s: float = 0.0,
        on_group: Callable[[int, int], None] | None = None,
    ) -> None:
        self._db = db
        self._max_batches = max_batches
        self._max_rows = max_rows
        self._linger_s = linger_s
        self._on_group = on_group
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failing = False  # log a failing group once per change, not once per group

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ingest-groups", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._thread = None
        self._release_waiting()

    async def store(self, item: GroupedBatch) -> IngestResult | None:
        """The push's result once its group committed; None: store it on its own."""
        if self._thread is None:
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[IngestResult | None] = loop.create_future()
        self._queue.put(_Pending(item, loop, future))
        return await future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group, stopping = self._take_more(first)
            self._store(group)
            if stopping:
                return

    def _take_more(self, first: _Pending) -> tuple[list[_Pending], bool]:
        group, rows = [first], len(first.item.batch.samples)
        deadline = time.monotonic() + self._linger_s
        while len(group) < self._max_batches and rows < self._max_rows:
            try:
                pending = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if pending is None:
                return group, True
            group.append(pending)
            rows += len(pending.item.batch.samples)
        return group, False

    def _store(self, group: list[_Pending]) -> None:
        try:
            results = store_group(self._db, [p.item for p in group], now=utcnow())
        except Exception:  # noqa: BLE001 - every push of the group is then stored on its own
            if not self._failing:
                logger.warning("a group of %d pushes failed; storing each alone", len(group))
                logger.debug("group failure", exc_info=True)
            self._failing = True
            results = [None] * len(group)
        else:
            self._failing = False
        for pending, result in zip(group, results, strict=True):
            _post(pending, result)
        if self._on_group is not None:
            self._on_group(len(group), sum(r is not None for r in results))

    def _release_waiting(self) -> None:
        """Pushes still queued at shutdown go their own way (their route stores or refuses)."""
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return
            if pending is not None:
                _post(pending, None)
