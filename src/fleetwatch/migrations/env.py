"""Alembic environment: the URL or an open connection comes from fleetwatch, not an ini file."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from fleetwatch.server.db import tables  # noqa: F401  (registers the tables on metadata)
from fleetwatch.server.db.base import metadata
from fleetwatch.server.db.migrate import include_name

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=metadata,
        compare_type=True,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",  # type: ignore[attr-defined]
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()  # a failed migration too: the pooled connection is closed, not left


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
