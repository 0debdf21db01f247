"""Helpers for the server's HTTP tests: push a batch as an agent, count stored rows, extra apps."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from tests.conftest import bearer

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpus, ingest_batches, nodes
from fleetwatch.server.repo.sample_reader import count_samples

STORED_TABLES = {
    "nodes": nodes,
    "gpus": gpus,
    "events": events,
    "ingest_batches": ingest_batches,
}

Push = Callable[..., httpx.Response]


def row_counts(db: Database) -> dict[str, int]:
    """Rows in every table an ingest writes to; ``gpu_samples``: the samples stored (the ticks of
    every sample block)."""
    with db.read() as conn:
        counts = {
            name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for name, table in STORED_TABLES.items()
        }
        counts["gpu_samples"] = count_samples(conn)
    return counts


@pytest.fixture
def push(client: TestClient, tokens: dict[str, str]) -> Push:
    """``push(batch)`` POSTs a batch (a dict, or raw bytes) to /v1/ingest with the agent token."""

    def _push(
        batch: dict[str, Any] | bytes,
        *,
        headers: dict[str, str] | None = None,
        on: TestClient | None = None,
    ) -> httpx.Response:
        body = batch if isinstance(batch, bytes) else json.dumps(batch).encode()
        sent = {"Content-Type": "application/json", **bearer(tokens["agent"]), **(headers or {})}
        return (on or client).post("/v1/ingest", content=body, headers=sent)

    return _push


@pytest.fixture
def read(client: TestClient, tokens: dict[str, str]) -> Callable[..., httpx.Response]:
    """``read(path, **params)`` GETs with the read token and insists on 200."""

    def _read(path: str, **params: Any) -> httpx.Response:
        response = client.get(path, params=params, headers=bearer(tokens["read"]))
        assert response.status_code == 200, response.text
        return response

    return _read


@pytest.fixture
def make_client(settings: ServerSettings) -> Iterator[Callable[..., TestClient]]:
    """``make_client(max_body_bytes=4096)``: another app on the same database, other settings."""
    with ExitStack() as stack:

        def _make(**overrides: Any) -> TestClient:
            app = create_app(settings.model_copy(update=overrides))
            return stack.enter_context(TestClient(app))

        yield _make
