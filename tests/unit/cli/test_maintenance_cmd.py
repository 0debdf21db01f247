"""``fleetwatch maintenance``: what it refuses before calling the server, and a server it cannot
reach. Calls to a real server: tests/integration/test_maintenance_live.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from fleetwatch.cli import main

NOWHERE = "http://127.0.0.1:1"  # nothing listens on port 1: refused at once


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """No FLEETWATCH_URL/TOKEN from the environment; the CLI's logging set-up (it replaces the
    root handlers) is undone afterwards."""
    monkeypatch.delenv("FLEETWATCH_URL", raising=False)
    monkeypatch.delenv("FLEETWATCH_TOKEN", raising=False)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield CliRunner()
    root.handlers[:], root.level = saved


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--node", "n1", "--selector", "rack=r1", "--until-ended"], "not both"),
        (["--until-ended"], "--node (one or more) or --selector"),
        (["--node", "n1"], "--end or --until-ended"),
        (["--node", "n1", "--end", "4h", "--until-ended"], "--end or --until-ended"),
        (["--node", "n1", "--until-ended", "--start", "tomorrow"], "not an ISO 8601 time"),
        (["--node", "n1", "--until-ended", "--start", "2026-12-02T06:00:00"], "UTC offset"),
        (["--node", "n1", "--end", "soon"], "not an ISO 8601 time"),
    ],
)
def test_maintenance_add_refuses_bad_flags_with_exit_2(
    runner: CliRunner, args: list[str], says: str
) -> None:
    result = runner.invoke(
        main,
        ["maintenance", "add", *args, "--reason", "x", "--server", NOWHERE, "--token", "t"],
    )
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_maintenance_commands_fail_clearly_when_the_server_is_unreachable(
    runner: CliRunner,
) -> None:
    for args in (["list"], ["end", "3"], ["add", "--node", "n1", "--end", "2h", "--reason", "x"]):
        result = runner.invoke(main, ["maintenance", *args, "--server", NOWHERE, "--token", "t"])
        assert result.exit_code != 0, result.output
        assert f"cannot reach {NOWHERE}" in result.output


def test_maintenance_end_wants_a_window_id(runner: CliRunner) -> None:
    result = runner.invoke(main, ["maintenance", "end", "0", "--token", "t"])
    assert result.exit_code == 2 and "WINDOW_ID" in result.output
