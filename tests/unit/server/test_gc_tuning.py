"""A server process collects its young garbage less often (config gc_gen0_threshold); the
thresholds are restored after each test by tests/conftest.py."""

from __future__ import annotations

import gc
from pathlib import Path

from fastapi.testclient import TestClient

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app


def _settings(tmp_path: Path, **overrides: object) -> ServerSettings:
    return ServerSettings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path / 'fw.db'}",
        background_jobs=False,
        _env_file=None,
        **overrides,
    )


def test_a_started_server_raises_the_youngest_threshold_only(tmp_path: Path) -> None:
    gc.set_threshold(700, 10, 10)
    with TestClient(create_app(_settings(tmp_path, gc_gen0_threshold=12_345))):
        assert gc.get_threshold() == (12_345, 10, 10)


def test_zero_leaves_pythons_own_settings(tmp_path: Path) -> None:
    gc.set_threshold(700, 10, 10)
    with TestClient(create_app(_settings(tmp_path, gc_gen0_threshold=0))):
        assert gc.get_threshold() == (700, 10, 10)
