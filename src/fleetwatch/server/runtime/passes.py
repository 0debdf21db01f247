"""What a background pass is told by whatever runs it: which job it is and whom it gives way to.

A whole-fleet pass gives way to the urgent lane between its chunks
(:mod:`fleetwatch.server.runtime.precedence`). Whether it should, and to which process's
urgent lane, is the runner's business, not the domain code's: the scheduler runs each pass
inside a :class:`PassContext` (:meth:`PassContext.running`), and the domain code calls
:func:`give_way` at its checkpoints without being handed anything. Outside a pass (a test, a
CLI command, a route calling the same function) the context is :data:`OUTSIDE_A_PASS`, which
never waits.

A context variable rather than a thread-local: the scheduler's worker threads are pooled, and a
context set for one pass must not outlive it (:meth:`PassContext.running` resets it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from fleetwatch.server.runtime.precedence import NO_PRECEDENCE, Precedence

__all__ = ["OUTSIDE_A_PASS", "PassContext", "current_pass", "give_way"]


@dataclass(frozen=True)
class PassContext:
    """One pass of a job: ``precedence`` is its process's; ``ahead``, whether the pass is work
    others wait on (the urgent lane), which runs ahead of the others and never gives way."""

    job: str
    precedence: Precedence = NO_PRECEDENCE
    ahead: bool = False

    def give_way(self) -> None:
        """Let work that is waited on run first (see :meth:`Precedence.give_way`)."""
        if not self.ahead:
            self.precedence.give_way()

    @contextmanager
    def running(self) -> Iterator[PassContext]:
        """This context for the code run in the block (in this thread)."""
        token = _current.set(self)
        try:
            if self.ahead:
                with self.precedence.ahead():
                    yield self
            else:
                yield self
        finally:
            _current.reset(token)


OUTSIDE_A_PASS = PassContext("none")

_current: ContextVar[PassContext] = ContextVar("fleetwatch_pass", default=OUTSIDE_A_PASS)


def current_pass() -> PassContext:
    """The pass the calling code runs in (:data:`OUTSIDE_A_PASS` when none)."""
    return _current.get()


def give_way() -> None:
    """A checkpoint of a whole-fleet pass, where it holds nothing that urgent work needs (no
    lock of the judge's windows, the planner's or the alerts', no SQLite writer lock): waits
    while work runs ahead in another thread, if the pass running here gives way."""
    _current.get().give_way()
