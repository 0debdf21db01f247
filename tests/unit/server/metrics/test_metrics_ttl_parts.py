"""The default page's database parts are computed once per TTL and shared meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fleetwatch.server.metrics.ttl_parts import TtlParts


class _Clock:
    """Monotonic seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _counter() -> tuple[list[str], Callable[[], str]]:
    calls: list[str] = []

    def compute() -> str:
        calls.append("x")
        return f"part {len(calls)}\n"

    return calls, compute


def test_ttl_parts_reuses_a_part_within_its_ttl() -> None:
    clock = _Clock()
    parts = TtlParts(5.0, clock=clock)
    calls, compute = _counter()
    assert parts.get("ports", compute) == "part 1\n"
    clock.now += 4.9
    assert parts.get("ports", compute) == "part 1\n"
    assert len(calls) == 1


def test_ttl_parts_recomputes_a_part_once_its_ttl_passed() -> None:
    clock = _Clock()
    parts = TtlParts(5.0, clock=clock)
    calls, compute = _counter()
    parts.get("ports", compute)
    clock.now += 5.0
    assert parts.get("ports", compute) == "part 2\n"
    clock.now += 1.0  # fresh again, from the second computation
    assert parts.get("ports", compute) == "part 2\n"
    assert len(calls) == 2


def test_ttl_parts_keeps_each_part_apart() -> None:
    parts = TtlParts(5.0, clock=_Clock())
    assert parts.get("ports", lambda: "ports\n") == "ports\n"
    assert parts.get("evictions", lambda: "evictions\n") == "evictions\n"
    assert parts.get("ports", lambda: "other\n") == "ports\n"


def test_ttl_parts_with_ttl_zero_reads_every_time() -> None:
    parts = TtlParts(0.0, clock=_Clock())  # the clock never moves: still recomputed
    calls, compute = _counter()
    assert [parts.get("ports", compute) for _ in range(3)] == [
        "part 1\n",
        "part 2\n",
        "part 3\n",
    ]


def test_ttl_parts_concurrent_callers_share_one_computation() -> None:
    parts = TtlParts(5.0, clock=_Clock())
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        started.set()
        release.wait(timeout=10)
        return "shared\n"

    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(parts.get("ports", slow)))
    first.start()
    assert started.wait(timeout=10)
    second = threading.Thread(target=lambda: results.append(parts.get("ports", slow)))
    second.start()
    release.set()
    first.join(timeout=10)
    second.join(timeout=10)
    assert results == ["shared\n", "shared\n"]
    assert calls == [1]
