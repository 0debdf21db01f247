"""No test asserts on elapsed time: on a loaded CI machine any such bound fails now and then.

Tests check behaviour (calls counted, states reached, fake clocks); benchmarks measure time.
This scans every test module's ``assert`` statements for a clock reading in a subtraction
(``time.monotonic() - started < 1.0``), or for a name that was assigned one
(``elapsed = perf_counter() - t0`` ... ``assert elapsed < 30``). Waiting with a deadline stays
allowed: ``assert time.monotonic() < deadline, "timed out"`` compares no difference.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns"}
WALL_CLOCKS = {"now", "utcnow"}  # datetime.now(UTC) - started, utcnow() - t0


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in WALL_CLOCKS:
        return True
    if name not in CLOCKS:
        return False
    # time.time() / time.monotonic() / perf_counter(); not some_object.time(...)
    return not isinstance(func, ast.Attribute) or getattr(func.value, "id", "") == "time"


def _reads_a_clock(node: ast.AST) -> bool:
    return any(_is_clock_call(child) for child in ast.walk(node))


def _elapsed_names(tree: ast.AST) -> set[str]:
    """Names assigned the difference of a clock reading and something else."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and node.value is not None:
            if _is_clock_difference(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _is_timedelta(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "timedelta"


def _is_clock_difference(node: ast.AST) -> bool:
    # now() - timedelta(days=29) is an instant in the past (test data), not an elapsed time.
    return any(
        isinstance(child, ast.BinOp)
        and isinstance(child.op, ast.Sub)
        and (_reads_a_clock(child.left) or _reads_a_clock(child.right))
        and not (_is_timedelta(child.left) or _is_timedelta(child.right))
        for child in ast.walk(node)
    )


def timing_asserts(source: str) -> list[int]:
    """Line numbers of the asserts in ``source`` that bound an elapsed time."""
    tree = ast.parse(source)
    elapsed = _elapsed_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        used = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
        if _is_clock_difference(node.test) or used & elapsed:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("t = time.monotonic()\nassert time.monotonic() - t < 1.0\n", [2]),
        ("s = perf_counter()\nelapsed = perf_counter() - s\nassert elapsed < 30\n", [3]),
        ("assert (datetime.now(UTC) - started).total_seconds() < 5\n", [1]),
        ("d = time.monotonic() + 5\nassert time.monotonic() < d, 'timed out'\n", []),
        ("assert reporter.sent == 0\n", []),
        ("old = make(start=datetime.now(UTC) - timedelta(days=29))\nassert push(old)\n", []),
    ],
)
def test_the_scanner_flags_elapsed_time_bounds_only(source: str, flagged: list[int]) -> None:
    assert timing_asserts(source) == flagged


def test_no_test_module_asserts_on_elapsed_time() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()
        for line in timing_asserts(path.read_text())
    ]
    assert found == [], "assert behaviour (counts, states, fake clocks), not elapsed time"
