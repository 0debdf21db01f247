"""PostgreSQL sessions run in UTC whatever the client's or server's default zone, and
timestamps come back as the same instants, in UTC (real PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import bindparam, select, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.base import UtcDateTime
from fleetwatch.server.db.session import make_engine

pytestmark = pytest.mark.postgres


def test_a_session_is_in_utc_and_reads_back_utc_instants(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTZ", "America/New_York")  # libpq's default zone for the session
    engine = make_engine(ServerSettings(database_url=postgres_url, _env_file=None))  # type: ignore[call-arg]
    try:
        when = datetime(2026, 7, 1, 23, 30, tzinfo=timezone(timedelta(hours=-4)))
        with engine.connect() as conn:
            assert conn.execute(text("SHOW TIME ZONE")).scalar() == "UTC"
            read = conn.execute(
                select(bindparam("when", when, type_=UtcDateTime)),
            ).scalar()
            day = conn.execute(
                text("SELECT CAST(CAST(:when AS timestamptz) AS date)"), {"when": when}
            ).scalar()
    finally:
        engine.dispose()
    assert read == when and read.tzinfo is UTC
    assert read == datetime(2026, 7, 2, 3, 30, tzinfo=UTC)
    assert str(day) == "2026-07-02"  # the UTC day, not New York's
