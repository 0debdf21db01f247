"""Migrations build exactly the declared schema, on SQLite and on real PostgreSQL."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

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


def _old_samples() -> list[dict[str, Any]]:
    """Samples as 0006 stored them, every field with a value that tests its new type."""
    from fleetwatch.telemetry import SAMPLE_FIELDS

    rows = []
    stamps = [
        datetime(2026, 11, 28, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 11, 29, tzinfo=UTC),
        datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC),
    ]
    for n, ts in enumerate(stamps):
        for g, uuid in enumerate(_OLD_GPUS):
            row: dict[str, Any] = {
                "gpu_uuid": uuid,
                "node_id": 1 + g // 2,
                "ts": ts,
                "boot_id": None if (n, g) == (0, 0) else f"boot-{g // 2}-{n % 2}",
            }
            for i, spec in enumerate(SAMPLE_FIELDS):
                if (n + g + i) % 7 == 0:
                    row[spec.name] = None  # not reported
                elif spec.kind == "flag":
                    row[spec.name] = (n + i) % 2 == 0
                elif spec.is_integer:
                    row[spec.name] = 2**62 + 7919 * i + n  # beyond what a double holds exactly
                elif spec.name in ("pcie_link_gen", "pcie_link_width", "gpu_recovery_action"):
                    row[spec.name] = float(1 + (n + g + i) % 16)
                else:
                    row[spec.name] = 1234.56789012 / (1 + i) + g + n / 3
            rows.append(row)
    return rows


_OLD_GPUS = [f"GPU-{'%08x' % (0xA0 + g)}-0000-4000-8000-000000000000" for g in range(4)]


def _fill_0006(conn: Any, now: datetime) -> list[dict[str, Any]]:
    from sqlalchemy import text

    for node in (1, 2):
        conn.execute(
            text(
                "INSERT INTO nodes (id, name, labels, interval_s, boot_id, first_seen, last_seen) "
                "VALUES (:id, :name, '{}', 10, :boot, :now, :now)"
            ),
            {"id": node, "name": f"n{node}", "boot": f"boot-{node - 1}-0", "now": now},
        )
    for g, uuid in enumerate(_OLD_GPUS):
        conn.execute(
            text(
                'INSERT INTO gpus (uuid, node_id, "index", serial, first_seen, last_seen) '
                "VALUES (:uuid, :node, :index, :serial, :first, :now)"
            ),
            # Registered in the reverse of their UUID order: ids follow first_seen.
            {"uuid": uuid, "node": 1 + g // 2, "index": g % 2, "serial": f"S{g}",
             "first": now - timedelta(days=10 - (3 - g)), "now": now},
        )  # fmt: skip
    samples = _old_samples()
    columns = list(samples[0])
    conn.execute(
        text(
            f"INSERT INTO gpu_samples ({', '.join(columns)}) "
            f"VALUES ({', '.join(':' + c for c in columns)})"
        ),
        samples,
    )
    conn.execute(
        text(
            "INSERT INTO events (node_id, gpu_uuid, kind, xid, ts, received_at, message) "
            "VALUES (1, :uuid, 'xid', 79, :now, :now, 'fell off the bus')"
        ),
        {"uuid": _OLD_GPUS[1], "now": now},
    )
    return samples


def _same_to_7_digits(new: Any, old: Any) -> bool:
    import math

    return math.isclose(new, old, rel_tol=1e-7, abs_tol=0.0)


def _row_table_samples(conn: Any) -> list[dict[str, Any]]:
    """The samples of a 0007-0016 ``gpu_samples`` (a row per GPU per tick), by id, with the GPU's
    UUID and the boot's id."""
    from sqlalchemy import DateTime, text

    query = text(
        "SELECT s.*, g.uuid AS gpu_uuid, b.boot_id AS boot_id FROM gpu_samples s "
        "JOIN gpus g ON g.id = s.gpu_id LEFT JOIN node_boots b ON b.id = s.boot ORDER BY s.id"
    ).columns(ts=DateTime(timezone=True))
    rows = [dict(row) for row in conn.execute(query).mappings()]
    for row in rows:  # SQLite hands back naive UTC
        row["ts"] = row["ts"].replace(tzinfo=UTC) if row["ts"].tzinfo is None else row["ts"]
    return rows


def _real_fields(conn: Any) -> set[str]:
    """The fields 0007 stored as ``real`` (7 significant digits on PostgreSQL)."""
    from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

    types = {c["name"]: str(c["type"]) for c in inspect(conn).get_columns("gpu_samples")}
    return {name for name in SAMPLE_FIELD_NAMES if types[name] == "REAL"}


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0007_keeps_every_sample_of_a_0006_database(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A database filled by the 0006 schema upgrades in place (to 0016, the last row table):
    every sample keeps its id, time, node, GPU, boot and values (reals to 7 significant digits);
    GPUs get ids in first-seen order; events are untouched; and back down to 0006."""
    from alembic import command
    from sqlalchemy import text

    from fleetwatch.server.db.migrate import alembic_config
    from fleetwatch.server.db.tables import gpus
    from fleetwatch.telemetry import SAMPLE_FIELDS

    db = _empty_database(kind, tmp_path, request)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    try:
        upgrade(db.engine, "0006")
        with db.engine.begin() as conn:
            old = _fill_0006(conn, now)
            old_ids = conn.execute(text("SELECT id FROM gpu_samples ORDER BY id")).scalars().all()
            events_before = conn.execute(text("SELECT * FROM events")).mappings().all()

        upgrade(db.engine, "0016")

        with db.engine.connect() as conn:
            new = _row_table_samples(conn)
            real = _real_fields(conn)
            gpu_ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
            assert conn.execute(text("SELECT * FROM events")).mappings().all() == events_before
        assert [row["id"] for row in new] == old_ids
        assert gpu_ids == {_OLD_GPUS[3]: 1, _OLD_GPUS[2]: 2, _OLD_GPUS[1]: 3, _OLD_GPUS[0]: 4}
        assert real  # temperatures, power, clocks, utilisation
        for was, now_row in zip(old, new, strict=True):
            for key in ("gpu_uuid", "node_id", "ts", "boot_id"):
                assert now_row[key] == was[key], key
            for spec in SAMPLE_FIELDS:
                before, after = was[spec.name], now_row[spec.name]
                if before is None or after is None:
                    assert before is after, spec.name
                elif spec.name in real and kind == "postgresql":
                    assert _same_to_7_digits(after, before), (spec.name, after, before)
                else:
                    assert after == before, spec.name  # exact: integers, doubles, flags
        if kind == "postgresql":
            with db.engine.connect() as conn:
                spread = conn.execute(
                    text("SELECT tableoid::regclass::text, count(*) FROM gpu_samples GROUP BY 1")
                ).all()
                assert conn.execute(text("SELECT count(*) FROM gpu_samples_default")).scalar() == 0
            assert dict(spread) == {
                "gpu_samples_p20261128": 4,
                "gpu_samples_p20261129": 4,
                "gpu_samples_p20261130": 4,
            }

        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0006")
        with db.engine.connect() as conn:
            back = conn.execute(text("SELECT * FROM gpu_samples ORDER BY id")).mappings().all()
        assert [row["id"] for row in back] == old_ids
        for was, row in zip(old, back, strict=True):
            assert (row["gpu_uuid"], row["boot_id"]) == (was["gpu_uuid"], was["boot_id"])
            assert row["energy_mj"] == was["energy_mj"]
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0017_keeps_every_sample_as_blocks(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A database filled by the row schema (0006, upgraded to 0016) becomes blocks in place: every
    sample keeps its time, node, GPU, boot and every value as 0016 held it (SQLite's doubles now
    to 7 significant digits, like PostgreSQL's reals); on PostgreSQL each block lies in its day's
    partition; the server then stores new batches after the converted blocks; and back down to
    0016, every sample is a row again."""
    import hashlib
    import json

    from alembic import command
    from sqlalchemy import text

    from fleetwatch.server.db import partitions
    from fleetwatch.server.db.migrate import alembic_config
    from fleetwatch.server.ingest.store import store_batch
    from fleetwatch.server.repo.sample_reader import count_samples, newest_block_id
    from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, Batch
    from tests.factories import make_batch
    from tests.stored_samples import stored_samples

    db = _empty_database(kind, tmp_path, request)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    try:
        upgrade(db.engine, "0006")
        with db.engine.begin() as conn:
            _fill_0006(conn, now)
            conn.execute(
                text(
                    "INSERT INTO leader_state (name, value, updated_at) "
                    "VALUES ('rollups', '{\"after_id\": 12}', :now)"
                ),
                {"now": now},
            )
        upgrade(db.engine, "0016")
        with db.engine.connect() as conn:
            rows = _row_table_samples(conn)
            real = _real_fields(conn)

        upgrade(db.engine)

        def key(sample: dict[str, Any]) -> tuple[Any, ...]:
            return (sample["gpu_uuid"], sample["ts"])

        with db.engine.connect() as conn:
            assert "gpu_samples" not in inspect(conn).get_table_names()
            blocks = stored_samples(conn)
            assert count_samples(conn) == len(rows) == 12
            rollups = conn.execute(
                text("SELECT count(*) FROM leader_state WHERE name = 'rollups'")
            ).scalar()
        assert rollups == 0  # a gpu_samples id: meaningless to blocks
        assert sorted(map(key, blocks)) == sorted(map(key, rows))
        for block, row in zip(sorted(blocks, key=key), sorted(rows, key=key), strict=True):
            assert (block["node_id"], block["gpu_id"], block["boot_id"]) == (
                row["node_id"], row["gpu_id"], row["boot_id"])  # fmt: skip
            for name in SAMPLE_FIELD_NAMES:
                before, after = row[name], block[name]
                if before is None or after is None:
                    assert before is after, name
                elif name in real or (kind == "sqlite" and isinstance(before, float)):
                    # 0016 on SQLite held the reals as doubles; blocks keep 7 digits of them.
                    assert _same_to_7_digits(after, before), (name, after, before)
                else:
                    assert after == before, name  # exact: integers, doubles, flags
        if kind == "postgresql":
            with db.engine.connect() as conn:
                spread = conn.execute(
                    text(
                        "SELECT tableoid::regclass::text, sum(n) FROM gpu_sample_blocks GROUP BY 1"
                    )
                ).all()
                assert partitions.default_rows(conn) == 0
            assert dict(spread) == {
                "gpu_sample_blocks_p20261128": 4,
                "gpu_sample_blocks_p20261129": 4,
                "gpu_sample_blocks_p20261130": 4,
            }

        with db.engine.connect() as conn:
            converted_newest = newest_block_id(conn)
        raw = make_batch("n1", gpus=1, start=now)
        body = json.dumps(raw).encode()
        store_batch(
            db,
            Batch.model_validate_json(body),
            content_sha256=hashlib.sha256(body).hexdigest(),
            now=now,
        )
        with db.engine.connect() as conn:
            newest = conn.execute(
                text("SELECT id, gpu_id FROM gpu_sample_blocks ORDER BY id DESC")
            ).first()
            added = count_samples(conn) - len(rows)
        assert converted_newest is not None and newest is not None
        assert newest.id > converted_newest and newest.gpu_id == 5 and added > 0

        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0016")
        with db.engine.connect() as conn:
            back = _row_table_samples(conn)
        assert len(back) == len(rows) + added
        converted = sorted((r for r in back if r["gpu_uuid"] in _OLD_GPUS), key=key)
        for was, row in zip(sorted(rows, key=key), converted, strict=True):
            assert key(was) == key(row) and row["boot_id"] == was["boot_id"]
            assert row["energy_mj"] == was["energy_mj"]  # an integer beyond a double's reach
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_node_and_gpu_rows_update_in_place_after_0014(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every push moves ``last_seen`` of its node and GPUs: no index may cover it, so that
    PostgreSQL updates the rows in place (HOT) instead of adding an entry to every index."""
    from sqlalchemy import text, update

    from fleetwatch.server.db.tables import gpus, nodes

    db = _empty_database(kind, tmp_path, request)
    try:
        upgrade(db.engine)
        with db.engine.connect() as conn:
            for table in ("nodes", "gpus"):
                indexed = {c for ix in inspect(conn).get_indexes(table) for c in ix["column_names"]}
                assert "last_seen" not in indexed, table
        if kind != "postgresql":
            return
        now = datetime(2026, 12, 1, tzinfo=UTC)
        with db.engine.begin() as conn:
            options = dict(
                conn.execute(
                    text(
                        "SELECT relname, reloptions FROM pg_class"
                        " WHERE relname IN ('nodes', 'gpus')"
                    )
                ).all()
            )
            assert options == {"nodes": ["fillfactor=50"], "gpus": ["fillfactor=50"]}
            node_id = conn.execute(
                insert(nodes)
                .values(name="n1", labels={}, interval_s=10.0, first_seen=now, last_seen=now)
                .returning(nodes.c.id)
            ).scalar_one()
            conn.execute(
                insert(gpus).values(
                    uuid="GPU-1", node_id=node_id, index=0, first_seen=now, last_seen=now
                )
            )
        with db.engine.begin() as conn:
            later = now + timedelta(seconds=60)
            conn.execute(update(nodes).values(last_seen=later))
            conn.execute(update(gpus).values(last_seen=later, latest_ts=later, latest={"x": 1}))
            hot = conn.execute(
                text(
                    "SELECT pg_stat_get_xact_tuples_hot_updated('nodes'::regclass),"
                    " pg_stat_get_xact_tuples_hot_updated('gpus'::regclass)"
                )
            ).one()
        assert tuple(hot) == (1, 1)
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0018_keeps_every_token_unbound_and_binds_new_ones(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 37: a 0017 database's tokens keep working, unbound (any node), through the upgrade;
    a token made after it can be bound; the downgrade drops the binding and keeps the tokens."""
    from alembic import command
    from sqlalchemy import text

    from fleetwatch.server.auth import authenticate, create_token
    from fleetwatch.server.db.migrate import alembic_config

    db = _empty_database(kind, tmp_path, request)
    token = "fwt_0123456789ab_old-agent-token-secret"
    try:
        upgrade(db.engine, "0017")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO api_tokens (token_id, name, scope, secret_sha256, created_at)"
                    " VALUES ('0123456789ab', 'old-agent', 'agent', :digest, :now)"
                ),
                {
                    "digest": hashlib.sha256(token.encode()).hexdigest(),
                    "now": datetime(2026, 12, 1, tzinfo=UTC),
                },
            )
        upgrade(db.engine)
        with db.engine.begin() as conn:
            old = authenticate(conn, token)
            assert (old.name, old.scope, old.node_pattern) == ("old-agent", "agent", None)
            secret, bound = create_token(conn, name="rack-7", scope="agent", node_pattern="gpu-7*")
            assert authenticate(conn, secret).node_pattern == bound.node_pattern == "gpu-7*"
        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0017")
        with db.engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("api_tokens")}
            names = set(conn.execute(text("SELECT name FROM api_tokens")).scalars())
        assert "node_pattern" not in columns
        assert names == {"old-agent", "rack-7"}
    finally:
        db.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0020_keeps_every_version_and_adds_evaluations(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 40: a 0019 database's model versions keep their status (the ok one still serves)
    with no evaluation; the downgrade turns a rejected version into a failed one, out of
    service, saying why."""
    from alembic import command

    from fleetwatch.server.db.migrate import alembic_config
    from fleetwatch.server.db.tables import risk_models
    from fleetwatch.server.repo.models import latest_ok_model

    db = _empty_database(kind, tmp_path, request)
    fit = {"lambda": 400.0, "rho": 1.2, "rho_ci": [1.1, 1.3]}
    params = {"format": 1, "fleet": fit, "groups": {}, "aft": None}
    at = datetime(2026, 12, 1, tzinfo=UTC)
    try:
        upgrade(db.engine, "0019")
        with db.engine.begin() as conn:
            # Only the columns a 0019 table has.
            conn.execute(
                insert(risk_models).values(
                    trained_at=at, trigger="schedule", status="ok", params=params
                )
            )
        upgrade(db.engine)
        with db.engine.begin() as conn:
            served = latest_ok_model(conn)
            assert served is not None and served.version == 1
            assert conn.execute(select(risk_models.c.evaluation)).scalar() is None
            conn.execute(
                insert(risk_models).values(
                    trained_at=at + timedelta(hours=6),
                    trigger="schedule",
                    status="rejected",
                    params=params,
                    evaluation={"promoted": False, "reason": "kept the champion"},
                )
            )
        config = alembic_config()
        with db.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0019")
        with db.engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("risk_models")}
            rows = conn.execute(
                select(risk_models.c.version, risk_models.c.status, risk_models.c.error).order_by(
                    risk_models.c.version
                )
            ).all()
        assert "evaluation" not in columns
        assert [tuple(r) for r in rows] == [
            (1, "ok", None),
            (2, "failed", "rejected: scored worse than the version in service"),
        ]
    finally:
        db.dispose()
