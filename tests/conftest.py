"""Shared fixtures: settings, an app client on SQLite, a real PostgreSQL database, tokens.

PostgreSQL: ``FLEETWATCH_TEST_DATABASE_URL`` if set, else the local server at 127.0.0.1:5432.
One throwaway database is created per run and dropped at the end. Where none can be reached the
PostgreSQL tests skip with the reason, unless ``FLEETWATCH_REQUIRE_POSTGRES=1`` (as `make test`
and CI set), where they fail instead: a green run then means PostgreSQL was tested.
"""

from __future__ import annotations

import gc
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import metadata
from tests.leak_check import pytest_runtest_teardown  # noqa: F401 - a hook of this conftest
from tests.process_logs import pytest_runtest_makereport  # noqa: F401 - a hook of this conftest
from tests.run_order import longest_first

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# Encrypts webhook secrets at rest in tests (PostgreSQL servers refuse secrets without a key).
TEST_SECRET_KEY = "gbQ8wacjKpfPdEwoxF_F7tkviWrs_OSrv8akOYcNQFo="


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)


@pytest.fixture(autouse=True)
def _gc_thresholds_restored() -> Iterator[None]:
    """A started app tunes this process's garbage collector (gc_gen0_threshold), as a server
    process should; a test process hosts many apps, so each test gets the thresholds back."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


def _server_url() -> str:
    return os.environ.get(
        "FLEETWATCH_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database for this test run."""
    with throwaway_postgres() as url:
        yield url


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped on exit; skips (or fails, where PostgreSQL is
    required) without one. For a fixture wider than a test, whose rows no other test's
    truncation may touch."""
    import psycopg

    base = make_url(ServerSettings(database_url=_server_url()).database_url)
    name = f"fleetwatch_test_{os.getpid()}_{secrets.token_hex(3)}"
    admin_dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        admin = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        reason = f"no PostgreSQL at {base.render_as_string()}: {exc}".splitlines()[0]
        if os.environ.get("FLEETWATCH_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required for this run: {reason}")
        pytest.skip(reason)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def migrated_postgres_url(postgres_url: str) -> str:
    db = Database(make_engine(ServerSettings(database_url=postgres_url)))
    upgrade(db.engine)
    db.dispose()
    return postgres_url


def _truncate(url: str) -> None:
    """Empty the tables a test left rows in, and restart every sequence at 1. Truncating all
    of them each time cost 90 ms a test on a quiet machine and several times that in a loaded
    run: most tests touch a few tables."""
    db = Database(make_engine(ServerSettings(database_url=url)))
    probe = " UNION ALL ".join(
        f"SELECT '{t.name}' WHERE EXISTS (SELECT 1 FROM {t.name})" for t in metadata.sorted_tables
    )
    with db.write() as conn:
        used = list(conn.execute(text(probe)).scalars())
        if used:
            conn.execute(text(f"TRUNCATE {', '.join(used)} CASCADE"))
        # A rolled-back insert moves a sequence too: tests count ids from 1.
        conn.execute(text("SELECT setval(oid, 1, false) FROM pg_class WHERE relkind = 'S'"))
    db.dispose()


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file migrated to head once per run, for each test to copy: migrating a fresh
    file took 0.7 s of every SQLite app's start, most of the server tests' own time. Migrations
    from scratch and from older schemas are tests of their own (test_migrations.py)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "fleetwatch.db"
    db = Database(make_engine(ServerSettings(database_url=f"sqlite:///{path}")))
    upgrade(db.engine)
    db.dispose()
    # The last connection's close checkpoints the WAL: the file alone is the whole database.
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == [], leftovers
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using this runs on the embedded SQLite file and on real PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "fleetwatch.db"
        shutil.copyfile(request.getfixturevalue("migrated_sqlite_file"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("migrated_postgres_url")
    _truncate(url)
    return url


@pytest.fixture
def settings(database_url: str) -> ServerSettings:
    # Background jobs off: tests drive rollups, lifetimes and assessments by hand.
    return ServerSettings(  # type: ignore[call-arg]
        database_url=database_url,
        metrics_cache_ttl_s=0,
        background_jobs=False,
        secret_keys=[TEST_SECRET_KEY],
        # PostgreSQL's group commit stores a routine push at once instead of waiting 250 ms for
        # others: a test's pushes come one after another, each waiting for its answer (40 pushes
        # took 11 s). The group path still stores them; its lingering has tests of its own.
        ingest_group_linger_ms=0,
        _env_file=None,
    )


@pytest.fixture
def client(settings: ServerSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def db(client: TestClient) -> Database:
    database: Database = client.app.state.db  # type: ignore[attr-defined]
    return database


@pytest.fixture
def tokens(db: Database) -> dict[str, str]:
    """One token per scope, keyed by scope."""
    made = {}
    with db.write() as conn:
        for scope in ("agent", "read", "scheduler", "admin"):
            made[scope], _ = create_token(conn, name=f"test-{scope}", scope=scope)
    return made


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def require_tool(name: str) -> str:
    """The path of a command-line tool the test drives (promtool, amtool, chromium, pdftoppm).

    Missing: a failure under ``make test`` (FLEETWATCH_REQUIRE_TOOLS=1, which installs them with
    scripts/ensure-debs.sh), a skip naming the Debian package elsewhere.
    """
    import shutil

    path = shutil.which(name)
    if path is None:
        message = f"{name} not found: run scripts/ensure-debs.sh (make test does)"
        if os.environ.get("FLEETWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
