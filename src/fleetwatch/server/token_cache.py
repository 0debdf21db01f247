"""Verified bearer tokens, remembered for a few seconds so that a request costs no token query.

Checking a token costs a pool checkout, a ``SELECT`` and a threadpool hop on every request (0.4
to 0.7 ms of server CPU each, in benchmarks/HISTORY.md). A token that checked out is remembered
for ``ttl_s`` seconds, keyed by its SHA-256, so no secret is held in clear. What a revocation
takes to bite:

- made through this process (``DELETE /v1/tokens/...``): at once, :meth:`TokenCache.forget`;
- made elsewhere (another server process or replica, ``fleetwatch token revoke``): within
  ``ttl_s``. An entry expires ``ttl_s`` after its check *began*, and a check that began before
  the revocation committed may not see it, so no entry outlives the revocation by more.

Refusals are never remembered: an unknown, revoked or malformed token is looked up every time.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from fleetwatch.server.auth import TokenInfo

__all__ = ["TokenCache"]


class TokenCache:
    """``clock``: monotonic seconds (tests inject one); ``max_entries`` bounds the memory (each
    agent normally shares a token with many; past the bound the cache starts afresh)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[str, tuple[TokenInfo, float]] = {}
        self._lock = threading.Lock()
        # Bumped by every forget(): a check that was running meanwhile is not remembered.
        self._revocations = 0

    def get(self, token: str) -> TokenInfo | None:
        """The token's info if it checked out less than ``ttl_s`` ago, else None."""
        entry = self._entries.get(_key(token))
        if entry is None or self._clock() >= entry[1]:
            return None
        return entry[0]

    def remember(self, token: str, check: Callable[[], TokenInfo]) -> TokenInfo:
        """``check()`` (which raises for a token it refuses), remembered when it passes."""
        started, revocations = self._clock(), self._revocations
        info = check()
        if self.ttl_s <= 0:
            return info
        with self._lock:
            if revocations != self._revocations:
                return info  # a revocation raced this check: do not keep what it saw
            if len(self._entries) >= self._max_entries:
                self._drop_expired()
            self._entries[_key(token)] = (info, started + self.ttl_s)
        return info

    def forget(self, token_id: str) -> None:
        """Drop a token revoked by this process, and any check of it still running."""
        with self._lock:
            self._revocations += 1
            self._entries = {k: v for k, v in self._entries.items() if v[0].token_id != token_id}

    def _drop_expired(self) -> None:
        now = self._clock()
        self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
        if len(self._entries) >= self._max_entries:
            self._entries = {}


def _key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
