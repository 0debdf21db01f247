"""Fixtures for the scheduler adapter tests: a fake scheduler API, a CLI runner, and a sync loop
running in a thread."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from click.testing import CliRunner
from tests.fake_scheduler_api import FakeSchedulerApi, serve_fake_api

from fleetwatch.adapters.sync import SyncEngine


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


@contextmanager
def sync_loop(engine: SyncEngine, api: FakeSchedulerApi, interval_s: float) -> Iterator[None]:
    """``engine.run_forever`` in a thread for the block, as ``slurm-sync`` runs it; stopped after
    (its long-poll released by closing the fake API)."""
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop, interval_s), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        api.close()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the sync loop did not stop"
