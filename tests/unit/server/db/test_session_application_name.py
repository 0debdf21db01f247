"""Each PostgreSQL session names the server role it works for in ``pg_stat_activity``, unless
the database URL names one itself (real PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import make_url, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import make_engine

pytestmark = pytest.mark.postgres


def _application_name(url: str, role: str) -> str:
    settings = ServerSettings(database_url=url, role=role, _env_file=None)  # type: ignore[call-arg]
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    text(
                        "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("role", ["api", "worker", "all"])
def test_a_session_names_its_role(postgres_url: str, role: str) -> None:
    assert _application_name(postgres_url, role) == f"fleetwatch {role}"


def test_the_urls_own_application_name_wins(postgres_url: str) -> None:
    url = make_url(postgres_url).update_query_dict({"application_name": "ops-console"})
    assert _application_name(url.render_as_string(hide_password=False), "api") == "ops-console"
