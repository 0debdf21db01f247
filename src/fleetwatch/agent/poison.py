"""Telling a poisoned batch from a server outage.

A batch the server answers with a plain 500, again and again, while it takes other batches, is one
the server will never take (a byte it cannot store): kept at the head of the spool it would block
the node's telemetry for good. An outage looks different: 502/503/504 (a proxy or the server is
down) or 507 (its disk is full) never count, nor do timeouts and refused connections, and a batch
is only given up on when the server takes another batch (or, with none behind it, answers
``/readyz``) right before the last 500: an outage must never cost data.

:class:`FailureLog` remembers, per batch, when the first 500 came and how many followed; a batch
is *suspect* once it has had at least ``min_attempts`` of them over at least ``after_s`` seconds.
The clock is injected so that tests need not wait.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["POISON_STATUS", "FailureLog", "Failures"]

POISON_STATUS = 500  # the only answer that can mark a batch as poisoned
_REMEMBERED = 256  # batches tracked at once; the oldest are forgotten first


@dataclass
class Failures:
    first_s: float  # clock reading at the first 500
    attempts: int
    answer: str  # the server's last answer (status line and body), for the operator


class FailureLog:
    def __init__(self, *, after_s: float, min_attempts: int, clock: Callable[[], float]) -> None:
        self.after_s = after_s
        self.min_attempts = min_attempts
        self._clock = clock
        self._failures: OrderedDict[str, Failures] = OrderedDict()

    def record(self, batch_id: str, answer: str) -> Failures:
        """One more plain 500 for this batch."""
        failures = self._failures.get(batch_id)
        if failures is None:
            failures = self._failures[batch_id] = Failures(self._clock(), 0, answer)
            while len(self._failures) > _REMEMBERED:
                self._failures.popitem(last=False)
        failures.attempts += 1
        failures.answer = answer
        return failures

    def suspect(self, batch_id: str) -> bool:
        failures = self._failures.get(batch_id)
        return (
            failures is not None
            and failures.attempts >= self.min_attempts
            and self._clock() - failures.first_s >= self.after_s
        )

    def get(self, batch_id: str) -> Failures | None:
        return self._failures.get(batch_id)

    def failing_s(self, batch_id: str) -> float:
        failures = self._failures.get(batch_id)
        return 0.0 if failures is None else self._clock() - failures.first_s

    def forget(self, batch_id: str) -> None:
        self._failures.pop(batch_id, None)
