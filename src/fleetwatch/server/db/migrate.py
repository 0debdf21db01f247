"""Schema migrations: upgrade to head, and tell whether a database is at head."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import fleetwatch.migrations
from fleetwatch.config import ServerSettings
from fleetwatch.errors import SchemaOutOfDate
from fleetwatch.server.db.partitions import is_partition_name

__all__ = [
    "alembic_config",
    "current_revision",
    "head_revision",
    "include_name",
    "prepare_database",
    "upgrade",
]

SCRIPT_LOCATION = str(Path(fleetwatch.migrations.__file__).parent)


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """Alembic's filter of what to compare with the declared schema: not the day partitions of
    ``gpu_sample_blocks`` (data, created and dropped by the retention job)."""
    return not (type_ == "table" and name is not None and is_partition_name(name))


@functools.cache  # the migrations shipped with this process do not change under it
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations shipped"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (default: this version's head)."""
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def prepare_database(engine: Engine, settings: ServerSettings) -> None:
    """Migrate the embedded SQLite file; insist that PostgreSQL was migrated by an operator."""
    if settings.is_sqlite:
        # At head already (every start but the first and an upgrade's): alembic's run, which
        # loads every migration script, would change nothing.
        if current_revision(engine) != head_revision():
            upgrade(engine)
        return
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutOfDate(current, head)
