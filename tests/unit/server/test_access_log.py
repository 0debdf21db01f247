"""The access-log filter on records shaped as uvicorn makes them (the real server process is
tested in tests/integration/test_server_process.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleetwatch.config import ServerSettings
from fleetwatch.server.access_log import ACCESS_LOGGER, AcceptedPushFilter, log_accepted_pushes
from fleetwatch.server.app import create_app


def _record(method: str, path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        ACCESS_LOGGER, logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", method, path, "1.1", status), None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "status", "kept"),
    [
        ("POST", "/v1/ingest", 200, False),
        ("POST", "/v1/ingest", 401, True),
        ("POST", "/v1/ingest", 422, True),
        ("POST", "/v1/ingest", 500, True),
        ("GET", "/v1/ingest", 200, True),
        ("POST", "/v1/ingest?x=1", 200, True),
        ("GET", "/v1/nodes", 200, True),
    ],
)
def test_only_an_accepted_push_is_dropped(method: str, path: str, status: int, kept: bool) -> None:
    assert AcceptedPushFilter().filter(_record(method, path, status)) is kept


def test_a_record_of_another_shape_is_kept() -> None:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "plain", None, None)
    assert AcceptedPushFilter().filter(record) is True


def test_the_filter_is_installed_once_and_removed_on_request() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    try:
        log_accepted_pushes(False)
        log_accepted_pushes(False)
        assert sum(isinstance(f, AcceptedPushFilter) for f in logger.filters) == 1
        log_accepted_pushes(True)
        assert not any(isinstance(f, AcceptedPushFilter) for f in logger.filters)
    finally:
        log_accepted_pushes(True)


@pytest.mark.parametrize("enabled", [False, True])
def test_the_app_applies_the_setting(tmp_path: Path, enabled: bool) -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    settings = ServerSettings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path / 'fw.db'}",
        background_jobs=False,
        log_accepted_pushes=enabled,
        _env_file=None,
    )
    try:
        with TestClient(create_app(settings)):
            installed = any(isinstance(f, AcceptedPushFilter) for f in logger.filters)
            assert installed is not enabled
    finally:
        log_accepted_pushes(True)
