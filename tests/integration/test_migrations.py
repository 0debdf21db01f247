"""Migrations build exactly the declared schema, on SQLite and on real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, insert, inspect, select

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.migrate import current_revision, head_revision, include_name, upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import jobs, leader_state, metadata, straggler_state, stragglers


def _empty_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Database:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        # A database of its own: the shared test database is migrated by other tests.
        import psycopg
        from sqlalchemy.engine import make_url

        base = make_url(request.getfixturevalue("postgres_url"))
        name = f"{base.database}_mig"
        dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}"')

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        request.addfinalizer(drop)
        url = base.set(database=name).render_as_string(hide_password=False)
    return Database(make_engine(ServerSettings(database_url=url)))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migrations_build_the_declared_schema(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = _empty_database(kind, tmp_path, request)
    try:
        assert current_revision(db.engine) is None
        upgrade(db.engine)
        assert current_revision(db.engine) == head_revision()
        with db.engine.connect() as conn:
            opts = {"compare_type": True, "include_name": include_name}
            context = MigrationContext.configure(conn, opts=opts)
            differences = compare_metadata(context, metadata)
            tables = set(inspect(conn).get_table_names())
        assert differences == []
        assert set(metadata.tables) <= tables
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migrations_upgrade_is_idempotent_and_downgrade_empties(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from alembic import command

    from fleetwatch.server.db.migrate import alembic_config

    db = _empty_database(kind, tmp_path, request)
    try:
        upgrade(db.engine)
        upgrade(db.engine)  # a second run finds nothing to do
        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "base")
        with db.engine.connect() as conn:
            left = set(inspect(conn).get_table_names()) - {"alembic_version"}
        assert left == set()
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0006_upgrades_an_existing_database_in_place(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A 0005 database with a job and its open verdict keeps both through the upgrade, gains the
    two (empty) state tables, and loses only those on the way back down."""
    from alembic import command

    from fleetwatch.server.db.migrate import alembic_config

    db = _empty_database(kind, tmp_path, request)
    now = datetime.now(UTC)
    try:
        upgrade(db.engine, "0005")
        with db.engine.begin() as conn:
            conn.execute(
                insert(jobs).values(
                    job_id="j1", first_seen=now, last_seen=now, ranks=8, nodes=["n1"]
                )
            )
            conn.execute(insert(stragglers).values(
                job_id="j1", node="n1", kind="hardware", started_at=now, updated_at=now,
                windows=3, ratio=1.4, evidence={"reason": "got slower"}))  # fmt: skip
        upgrade(db.engine)
        assert current_revision(db.engine) == head_revision()
        with db.engine.connect() as conn:
            assert conn.execute(select(jobs.c.job_id)).scalars().all() == ["j1"]
            assert conn.execute(select(stragglers.c.evidence)).scalar_one() == {
                "reason": "got slower"
            }
            for table in (leader_state, straggler_state):
                assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 0
        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0005")
        with db.engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            assert conn.execute(select(jobs.c.job_id)).scalars().all() == ["j1"]
        assert {"leader_state", "straggler_state"}.isdisjoint(names) and "stragglers" in names
    finally:
        db.dispose()
