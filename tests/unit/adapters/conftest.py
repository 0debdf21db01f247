"""Fixtures for the scheduler adapter tests: a fake scheduler API and a CLI runner."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from tests.fake_scheduler_api import FakeSchedulerApi, serve_fake_api


@pytest.fixture
def api() -> Iterator[FakeSchedulerApi]:
    with serve_fake_api() as fake:
        yield fake


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CliRunner with no FLEETWATCH_SCHEDULER_* from the environment; the CLI's logging
    set-up (it replaces the root handlers) is undone afterwards."""
    for name in list(os.environ):
        if name.startswith("FLEETWATCH_SCHEDULER_"):
            monkeypatch.delenv(name)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield CliRunner()
    root.handlers[:], root.level = saved
