"""Hostile remote-write bodies (the part schemathesis cannot generate): random bytes, truncated
and bit-flipped real requests. Each is answered 204 or a 4xx, never a 5xx, and a refused one
stores nothing. Deterministic: a fixed seed, a fixed number of cases."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest
import snappy
from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.conftest import bearer

from fleetwatch.remote_write.exposition import scrape_series
from fleetwatch.remote_write.wire import encode_write_request
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import remote_write_staging

PAGE = (
    Path(__file__).resolve().parents[4]
    / "../shared/fixtures/dcgm_exporter/metrics/datadog__dcgm_tests_fixtures_metrics.txt"
)
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
CASES = 80


def _bodies(valid: bytes, raw: bytes, rng: random.Random) -> list[bytes]:
    bodies = [b"", b"\x00", valid[: len(valid) // 2], snappy.compress(raw[: len(raw) // 3])]
    for _ in range(CASES):
        kind = rng.randrange(3)
        if kind == 0:
            bodies.append(rng.randbytes(rng.randrange(1, 400)))
        elif kind == 1:  # a real request's protobuf with bytes flipped, then compressed
            flipped = bytearray(raw)
            for _ in range(rng.randrange(1, 8)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            bodies.append(snappy.compress(bytes(flipped)))
        else:  # the compressed body itself damaged
            damaged = bytearray(valid)
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            bodies.append(bytes(damaged))
    return bodies


# SQLite only: what refuses a body is the router, before any database is reached.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_hostile_bodies_are_answered_without_a_server_error(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    ms = int(datetime.now(UTC).timestamp() * 1000)
    valid = encode_write_request(scrape_series(PAGE.read_text(), ms))
    raw = snappy.uncompress(valid)
    statuses = []
    for body in _bodies(valid, raw, random.Random(38)):
        before = _staged(db)
        response = client.post(
            "/api/v1/write", content=body, headers=HEADERS | bearer(tokens["agent"])
        )
        statuses.append(response.status_code)
        assert response.status_code < 500, (body[:40], response.text)
        if response.status_code >= 400:
            assert response.json()["error"]
            assert _staged(db) == before  # a refused request stored nothing
    assert 400 in statuses and 204 in statuses  # both kinds of answer were exercised


def _staged(db: Database) -> list[tuple[str, datetime, object]]:
    with db.read() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(
                    remote_write_staging.c.key,
                    remote_write_staging.c.ts,
                    remote_write_staging.c.pending,
                ).order_by(remote_write_staging.c.key, remote_write_staging.c.ts)
            )
        ]
