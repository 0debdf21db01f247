"""One bad item never stops a background pass for the rest of the fleet.

A background pass (alerts, the planner, lifetimes, ...) works through many items: GPUs, nodes,
alerts, evictions, deliveries. Without isolation, one item that fails (a value the database
refuses, a bug hit by one odd row) fails the whole pass, every tick, for everyone: one node's
alert blocks every other node's. An :class:`ItemGuard` runs each item so that its failure is

- logged with the item's id, once when it starts failing (with the traceback), once when it
  recovers, and not on every pass in between;
- counted on ``/metrics`` as ``fleetwatch_background_item_errors_total{job}`` (every failure);
- contained: the pass carries on with the other items.

A database error aborts a PostgreSQL transaction, so an item that writes is isolated by a
SAVEPOINT. One per item would double the statements of a pass over 10,000 GPUs, so
:meth:`ItemGuard.each` first runs all items in one savepoint and only when that fails redoes them
one savepoint each: the common pass costs one savepoint, a pass with a bad item costs one per item.
Work functions must therefore return their results rather than record them elsewhere (they may
run twice), and must not commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection

__all__ = ["ItemGuard"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_REMEMBERED = 10_000  # failing items remembered per job, so that each is logged once


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class ItemGuard:
    """Isolates the items of one background job; remembers which are failing between passes."""

    def __init__(self, job: str, counter: _Counter | None = None) -> None:
        self.job = job
        self.counter = counter
        self.errors = 0  # every item failure since start, as counted on /metrics
        self._failing: dict[Hashable, str] = {}

    @property
    def failing(self) -> set[Hashable]:
        """Ids of the items whose last attempt failed."""
        return set(self._failing)

    def error_of(self, item_id: Hashable) -> str | None:
        """How ``item_id``'s last attempt failed (exception type and first line of its message),
        or None when it did not: for a caller that names the failure to the operator."""
        return self._failing.get(item_id)

    def each(
        self,
        conn: Connection | None,
        items: Iterable[T],
        work: Callable[[T], R],
        ident: Callable[[T], Hashable] = lambda item: item,
    ) -> list[tuple[T, R]]:
        """``work(item)`` for every item; (item, result) of those that succeeded, in order.

        With ``conn``, writes of a failed item are rolled back (see the module docstring). Items
        that failed last time run in a savepoint of their own first, so that one bad item that
        stays does not cost every later pass the fallback."""
        items = list(items)
        done: dict[int, R] = {}
        if conn is None or len(items) <= 1:
            self._one_by_one(conn, items, range(len(items)), work, ident, done)
            return [(items[i], done[i]) for i in sorted(done)]
        failing = self._failing
        suspects = [i for i, item in enumerate(items) if ident(item) in failing] if failing else []
        self._one_by_one(conn, items, suspects, work, ident, done)
        skip = set(suspects)
        rest = [i for i in range(len(items)) if i not in skip]
        grouped: dict[int, R] = {}
        try:
            with conn.begin_nested():
                for i in rest:
                    grouped[i] = work(items[i])
        except Exception:  # noqa: BLE001 - which item failed is found item by item below
            grouped = {}
        if len(grouped) == len(rest):
            done.update(grouped)
        else:  # outside the except: a retry's failure is its own, not "during handling" of this
            self._one_by_one(conn, items, rest, work, ident, done)
        return [(items[i], done[i]) for i in sorted(done)]

    def _one_by_one(
        self,
        conn: Connection | None,
        items: list[T],
        indexes: Iterable[int],
        work: Callable[[T], R],
        ident: Callable[[T], Hashable],
        done: dict[int, R],
    ) -> None:
        for i in indexes:
            with self.item(conn, ident(items[i])) as ok:
                result = work(items[i])
            if ok:
                done[i] = result

    def many(
        self,
        conn: Connection,
        rows: list[dict[str, Any]],
        write: Callable[[list[dict[str, Any]]], object],
        ident: Callable[[dict[str, Any]], Hashable],
    ) -> int:
        """``write(rows)`` at once (an executemany); when that fails, row by row so that only the
        bad rows are lost (rows that failed last time are written apart, one by one).
        Returns how many rows were written."""
        failing = self._failing
        alone = [row for row in rows if ident(row) in failing] if failing else []
        rest = [row for row in rows if ident(row) not in failing] if alone else rows
        written = 0
        if len(rest) > 1:
            try:
                with conn.begin_nested():
                    write(rest)
                written = len(rest)
            except Exception:  # noqa: BLE001 - found row by row below
                pass
        if not written:
            alone = alone + rest
        singles = [[row] for row in alone]
        done: dict[int, object] = {}
        self._one_by_one(conn, singles, range(len(singles)), write, lambda one: ident(one[0]), done)
        return written + len(done)

    @contextmanager
    def item(self, conn: Connection | None, item_id: Hashable) -> Iterator[list[bool]]:
        """Run the block as one item: an exception is logged, counted and swallowed, and with
        ``conn`` the block's writes are rolled back. The yielded flag is truthy after a success."""
        ok: list[bool] = []
        try:
            if conn is None:
                yield ok
            else:
                with conn.begin_nested():
                    yield ok
        except Exception as exc:  # noqa: BLE001 - isolating any failure is the point
            self.record_failure(item_id, exc)
        else:
            ok.append(True)
            self.recovered(item_id)

    def record_failure(self, item_id: Hashable, exc: BaseException) -> None:
        """Count and (once per change) log a failure of ``item_id`` handled elsewhere."""
        self.errors += 1
        if self.counter is not None:
            self.counter.inc()
        # A database error's text carries the statement's parameters and PostgreSQL's DETAIL
        # the failing row (timestamps change every pass); the first line of the driver's own
        # message says what went wrong and stays the same.
        message = str(getattr(exc, "orig", None) or exc).partition("\n")[0]
        what = f"{type(exc).__name__}: {message}"
        if self._failing.get(item_id) != what:
            logger.warning(
                "background job %s: item %s failed, skipped (logged again when the error changes"
                " or it recovers)",
                self.job,
                item_id,
                exc_info=exc,
            )
        self._failing.pop(item_id, None)
        self._failing[item_id] = what
        if len(self._failing) > _REMEMBERED:
            # Items that failed once and never came back (a deleted node) must not pile up.
            del self._failing[next(iter(self._failing))]

    def recovered(self, item_id: Hashable) -> None:
        """Note a success of ``item_id`` (logged when it was failing)."""
        if self._failing.pop(item_id, None) is not None:
            logger.info("background job %s: item %s recovered", self.job, item_id)
