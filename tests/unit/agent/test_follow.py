"""Following a log file like tail -F: appends, partial lines, truncation, rotation, restarts."""

from __future__ import annotations

import os
from pathlib import Path

from fleetwatch.agent.follow import FileFollower


def test_follower_starts_at_the_end_and_reads_appended_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    follower = FileFollower(log)
    assert follower.read_lines() == []
    with log.open("a") as f:
        f.write("one\ntwo\nthr")
    assert follower.read_lines() == ["one", "two"]
    with log.open("a") as f:
        f.write("ee\n")
    assert follower.read_lines() == ["three"]


def test_follower_starts_over_after_truncation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\nb\n")
    follower = FileFollower(log, from_start=True)
    assert follower.read_lines() == ["a", "b"]
    log.write_text("c\n")  # copytruncate: same inode, shorter
    assert follower.read_lines() == ["c"]


def test_follower_reads_the_rest_of_a_rotated_file_then_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    follower = FileFollower(log, from_start=True)
    assert follower.read_lines() == ["a"]
    with log.open("a") as f:
        f.write("b\n")
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("c\n")
    assert follower.read_lines() == ["b", "c"]
    log.unlink()
    assert follower.read_lines() == []  # gone between rotation steps: wait, do not fail


def test_follower_resumes_from_saved_position_without_repeating_or_skipping(
    tmp_path: Path,
) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "pos.json"
    log.write_text("")
    follower = FileFollower(log, state_file=state)
    with log.open("a") as f:
        f.write("one\ntw")
    assert follower.read_lines() == ["one"]
    with log.open("a") as f:  # written while the agent is down
        f.write("o\nthree\n")
    restarted = FileFollower(log, state_file=state)
    assert restarted.read_lines() == ["two", "three"]
