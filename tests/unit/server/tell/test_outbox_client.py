"""The outbox worker closes the HTTP client it made, and only that one."""

from __future__ import annotations

import httpx

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database
from fleetwatch.server.tell.outbox import OutboxWorker


def test_close_closes_the_client_the_worker_made(db: Database, settings: ServerSettings) -> None:
    worker = OutboxWorker(db, settings)
    assert not worker.client.is_closed
    worker.close()
    assert worker.client.is_closed


def test_close_leaves_a_given_client_to_its_owner(db: Database, settings: ServerSettings) -> None:
    with httpx.Client() as client:
        worker = OutboxWorker(db, settings, client=client)
        worker.close()
        assert not client.is_closed
