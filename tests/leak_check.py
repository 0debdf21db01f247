"""The hook that makes a leak fail the test that leaked (imported by ``tests/conftest.py``).

An object in a reference cycle (a pooled connection inside an engine nobody disposed, an unclosed
socket) is freed by the cyclic garbage collector whenever it next runs; with warnings as errors,
its ResourceWarning is then an "unraisable" exception that pytest reports in whatever test the
collector happened to run in: CI failed that way on an innocent test, one run in two. So each
test's teardown ends with a collection of its own, and anything unraisable in it fails that
test's teardown, naming what leaked.

The survivors of each collection are frozen (``gc.freeze``): the next test's collection walks
only what that test made, not the whole heap of imports (a full collection in a test worker took
0.3 s or more). After the last test of a module they are unfrozen and collected with the rest,
so what the module's fixtures kept is checked there.
"""

from __future__ import annotations

import gc
import sys
import traceback
from collections.abc import Iterator

import pytest

__all__ = ["pytest_runtest_teardown"]


def _forget_apps() -> None:
    """Let the apps of finished tests go: FastAPI keeps, in module-level LRU caches of 4,096
    entries each, every endpoint and dependency it has classified, and with each its app. A test
    worker that has built hundreds of apps kept dozens of them, four million objects that every
    full collection walked (seconds each)."""
    from fastapi.dependencies import models

    for name in dir(models):
        cache_clear = getattr(getattr(models, name), "cache_clear", None)
        if name.endswith("_cached") and cache_clear is not None:
            cache_clear()


def _collect(*, everything: bool) -> list[str]:
    """Collect garbage; what each finaliser that failed in it said."""
    said: list[str] = []

    def heard(unraisable: sys.UnraisableHookArgs) -> None:
        # Formatted here: the arguments are only valid while the hook runs.
        lines = traceback.format_exception_only(unraisable.exc_type, unraisable.exc_value)
        said.append(f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}\n")
        said[-1] += "".join(lines)

    if everything:
        _forget_apps()
        gc.unfreeze()
    previous, sys.unraisablehook = sys.unraisablehook, heard
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous
    gc.freeze()
    return said


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    everything = nextitem is None or nextitem.module is not item.module  # type: ignore[attr-defined]
    try:
        result = yield
    except BaseException:
        _collect(everything=everything)  # the teardown's own failure is the one to report
        raise
    leaked = _collect(everything=everything)
    if leaked:
        pytest.fail(
            "left for the garbage collector (close it in the test or the code it drives):\n"
            + "\n".join(leaked),
            pytrace=False,
        )
    return result
