"""The hook that shows, under a failed test, the logs of the processes it started (imported by
``tests/conftest.py``).

A live server answers a failure with a bare "Internal Server Error"; its traceback is in the
server's own log under the test's ``tmp_path``, which the CI machine deletes with the run. CI
failed that way on two PostgreSQL tests once and left nothing to read, so every ``*.log`` a
failed test wrote under its ``tmp_path`` (servers, agents, workers) is attached to its report:
its last lines, where the error is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["pytest_runtest_makereport"]

TAIL_LINES = 60
MOST_LOGS = 8


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(lines[-TAIL_LINES:])


def process_log_sections(tmp_path: Path) -> list[tuple[str, str]]:
    """(title, last lines) of each non-empty log under ``tmp_path``, newest first."""
    logs = [p for p in tmp_path.rglob("*.log") if p.is_file() and p.stat().st_size > 0]
    logs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [(f"log {p.relative_to(tmp_path)}", _tail(p)) for p in logs[:MOST_LOGS]]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    tmp_path = funcargs.get("tmp_path")
    if report.when == "call" and report.failed and isinstance(tmp_path, Path):
        for title, text in process_log_sections(tmp_path):
            report.sections.append((title, text))
