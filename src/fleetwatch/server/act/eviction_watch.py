"""Wakes long-polls of the evictions list when an eviction is created or changes, in any process.

A scheduler may reach any replica, and the eviction may be created by another one, so an
in-process event is not enough:

- PostgreSQL: every eviction change sends ``NOTIFY fleetwatch_evictions`` in its own transaction
  (delivered on commit; see ``repo/evictions.py``). One listener thread per process holds a
  ``LISTEN`` connection and wakes every waiting request; it starts with the first long-poll, so a
  process nobody long-polls holds no such connection (and stops without waiting for one). A
  waiting request also re-reads the database every ``recheck_s`` (1 s), so a notification lost
  to a reconnect costs at most that.
- SQLite (one process): waiting requests re-read the database every 0.25 s.

Waiting requests hold neither a database connection nor a threadpool thread while they wait:
they await an ``asyncio`` future. ``stop()`` (server shutdown, or SIGINT/SIGTERM seen by uvicorn)
releases them all at once. :func:`long_poll` is that wait, for the evictions list and job notices
alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Sized
from types import FrameType
from typing import Any, TypeVar

from sqlalchemy import Engine

from fleetwatch.server.db.session import own_conninfo

__all__ = ["CHANNEL", "EvictionWatch", "long_poll"]

logger = logging.getLogger(__name__)

CHANNEL = "fleetwatch_evictions"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_Handler = Callable[[int, FrameType | None], Any]
# What a long-poll reads: the rows found first (nothing found: empty), then whatever goes with them.
_Answer = TypeVar("_Answer", bound=tuple[Sized, object])


class EvictionWatch:
    """Futures that the next eviction change (or ``stop``) resolves."""

    def __init__(self, engine: Engine, channel: str = CHANNEL) -> None:
        # The same watch serves job notices (channel ``fleetwatch_notices``, act/notices.py).
        self._engine = engine
        self._channel = channel
        self.is_postgres = engine.dialect.name == "postgresql"
        # How often a waiting request re-reads the database without being woken.
        self.recheck_s = 1.0 if self.is_postgres else 0.25
        self._waiters: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._chained: dict[int, _Handler] = {}

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        """Call from the server's event loop (the app's lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._watch_signals()

    def _ensure_listener(self) -> None:
        if self.is_postgres and self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(
                target=self._listen, name=f"{self._channel}-listener", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._unwatch_signals()
        self._wake_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def waiter(self) -> asyncio.Future[None]:
        """A future the next change resolves. Take it *before* reading, so that a change
        between the read and the wait is not missed; ``discard`` it when done."""
        self._ensure_listener()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._stop.is_set():
            future.set_result(None)
        else:
            self._waiters.add(future)
        return future

    def discard(self, future: asyncio.Future[None]) -> None:
        self._waiters.discard(future)

    def notify(self) -> None:
        """Wake the waiters of this process (thread-safe)."""
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._wake_all)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _listen(self) -> None:
        """LISTEN on a connection of its own, reconnecting after failures, until stopped."""
        import psycopg  # PostgreSQL only; imported here so SQLite servers never need it

        dsn = own_conninfo(self._engine)
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {self._channel}")
                    self.notify()  # changes made while not listening: waiters re-read
                    while not self._stop.is_set():
                        if any(True for _ in conn.notifies(timeout=0.5, stop_after=1)):
                            self.notify()
            except Exception as exc:  # noqa: BLE001 - the listener outlives any database failure
                logger.warning("%s listener: %s; reconnecting in 1 s", self._channel, exc)
                self._stop.wait(1.0)

    def _watch_signals(self) -> None:
        """uvicorn lets open requests finish before shutting down: release long-polls at the
        first SIGINT/SIGTERM, then let uvicorn's own handler run."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                self._chained[sig] = previous
                signal.signal(sig, self._on_signal)

    def _unwatch_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._chained.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)
        self._chained.clear()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._stop.set()
        self.notify()
        self._chained[sig](sig, frame)


async def long_poll(
    watch: EvictionWatch | None,
    read: Callable[[], Awaitable[_Answer]],
    *,
    wait_s: float,
    gone: Callable[[], Awaitable[bool]],
) -> _Answer:
    """``read()`` again on every change ``watch`` hears of (and every ``recheck_s``) until it
    finds rows, ``wait_s`` has passed, the client is ``gone()`` or the server stops; the last
    answer. Without a watch (an app not started by its lifespan) the first answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        # Taken before the read: a change between the read and the wait still wakes us.
        woken = watch.waiter() if watch is not None else None
        try:
            answer = await read()
            remaining = deadline - loop.time()
            if len(answer[0]) or remaining <= 0 or woken is None or watch is None or watch.stopping:
                return answer
            if await gone():
                return answer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(woken), min(remaining, watch.recheck_s))
        finally:
            if woken is not None and watch is not None:
                watch.discard(woken)
