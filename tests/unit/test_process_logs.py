"""A failed test's report carries the logs its processes wrote (tests/process_logs.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.process_logs import TAIL_LINES, process_log_sections


def test_each_log_is_shown_by_its_last_lines_newest_first(tmp_path: Path) -> None:
    (tmp_path / "agents" / "a").mkdir(parents=True)
    older = tmp_path / "agents" / "a" / "agent.log"
    older.write_text("agent started\n")
    os.utime(older, (1_000, 1_000))
    lines = [f"line {i}" for i in range(TAIL_LINES + 5)] + ["Traceback: IntegrityError"]
    (tmp_path / "server-20001.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "notes.txt").write_text("not a log")

    sections = process_log_sections(tmp_path)

    assert [title for title, _ in sections] == ["log server-20001.log", "log agents/a/agent.log"]
    shown = sections[0][1].splitlines()
    assert len(shown) == TAIL_LINES and shown[-1] == "Traceback: IntegrityError"
    assert "line 0" not in shown
