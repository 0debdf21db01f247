"""One owner per GPU when another push changes the owner under a push's feet (PostgreSQL).

``store_batch`` decides from the GPU's row whether a batch may store under it: a GPU another node
reports now is refused (409), one whose node went silent moves. Here another transaction holds,
uncommitted, what a concurrent push would have written: the GPU registered by another node, or
the GPU moved to another node. The push under test must wait for it (the test waits until
PostgreSQL shows it waiting on a lock, then commits the other transaction) and then be refused
as if it had come second, storing nothing; before the fix it stored its samples under a GPU the
row gave to another node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, insert, select, text, update
from tests.conftest import _truncate
from tests.factories import gpu_uuid, make_batch, make_gpu
from tests.faults.waiting import wait_for

from fleetwatch.config import ServerSettings
from fleetwatch.errors import GpuClaimed
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import events, gpu_sample_blocks, gpus, nodes
from fleetwatch.server.ingest.batch_decoder import decode_batch, ingest_limits
from fleetwatch.server.ingest.store import store_batch

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(migrated_postgres_url: str) -> Iterator[Database]:
    _truncate(migrated_postgres_url)
    db = Database(make_engine(ServerSettings(database_url=migrated_postgres_url)))
    yield db
    db.dispose()


def _store(db: Database, batch: dict[str, Any]) -> None:
    body = json.dumps(batch).encode()
    now = datetime.now(UTC)
    view = decode_batch(body, ingest_limits(ServerSettings(), now))
    store_batch(db, view, content_sha256=hashlib.sha256(body).hexdigest(), now=now)


def _claim(node: str, uuid_of: str) -> dict[str, Any]:
    """``node``'s first batch: its own GPU and GPU 1 of node ``uuid_of``, a sample of each."""
    batch = make_batch(node, gpus=1)
    shared = make_gpu(uuid_of, 1)
    batch["gpus"].append(shared)
    batch["samples"].append({**batch["samples"][0], "uuid": shared["uuid"]})
    return batch


def _new_node(conn: Connection, name: str) -> int:
    now = datetime.now(UTC)
    node_id: int = conn.execute(
        insert(nodes)
        .values(name=name, labels={}, interval_s=10.0, first_seen=now, last_seen=now)
        .returning(nodes.c.id)
    ).scalar_one()
    return node_id


@contextmanager
def _held(db: Database) -> Iterator[Connection]:
    """A transaction of another push, left open for the test to commit (rolled back if not)."""
    with db.engine.connect() as conn:
        yield conn


def _refused_after_waiting(db: Database, holder: Connection, batch: dict[str, Any]) -> None:
    """Push ``batch`` while ``holder`` is open; commit ``holder`` once the push waits on it;
    the push must then be refused with 409."""
    with ThreadPoolExecutor(1) as pool:
        push = pool.submit(_store, db, batch)

        def waiting() -> bool:
            with db.read() as conn:
                return bool(
                    conn.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND datname = current_database()"
                        )
                    ).scalar_one()
                )

        wait_for("the push to wait for the other transaction", lambda: waiting() or push.done())
        holder.commit()
        with pytest.raises(GpuClaimed) as refused:
            push.result(timeout=120)
    assert [d["loc"] for d in refused.value.detail] == [["body", "gpus", 1, "uuid"]]


def _stored(db: Database, uuid: str) -> dict[str, Any]:
    with db.read() as conn:
        owner = conn.execute(
            select(nodes.c.name).join(gpus, gpus.c.node_id == nodes.c.id).where(gpus.c.uuid == uuid)
        ).scalar()
        block_nodes = conn.execute(
            select(nodes.c.name)
            .distinct()
            .select_from(gpu_sample_blocks)
            .join(gpus, gpus.c.id == gpu_sample_blocks.c.gpu_id)
            .join(nodes, nodes.c.id == gpu_sample_blocks.c.node_id)
            .where(gpus.c.uuid == uuid)
        ).scalars()
        node_names = conn.execute(select(nodes.c.name).order_by(nodes.c.name)).scalars()
        moved = conn.execute(select(events.c.id).where(events.c.kind == "gpu_moved")).scalars()
        return {
            "owner": owner,
            "blocks from": set(block_nodes),
            "nodes": list(node_names),
            "gpu_moved events": len(list(moved)),
        }


def test_a_push_registering_a_gpu_another_push_is_registering_is_refused(pg: Database) -> None:
    uuid = gpu_uuid("shared", 1)
    with _held(pg) as other:
        now = datetime.now(UTC)
        winner = _new_node(other, "winner")
        other.execute(
            insert(gpus).values(uuid=uuid, node_id=winner, index=1, first_seen=now, last_seen=now)
        )
        _refused_after_waiting(pg, other, _claim("late", "shared"))

    assert _stored(pg, uuid) == {
        "owner": "winner",
        "blocks from": set(),
        "nodes": ["winner"],
        "gpu_moved events": 0,
    }


def test_a_push_moving_a_gpu_another_push_is_moving_is_refused(pg: Database) -> None:
    _store(pg, _claim("old", "shared"))
    uuid = gpu_uuid("shared", 1)
    with pg.write() as conn:  # node "old" has been silent about the GPU for a day
        conn.execute(
            update(gpus)
            .where(gpus.c.uuid == uuid)
            .values(last_seen=datetime.now(UTC) - timedelta(days=1))
        )
    with _held(pg) as other:
        winner = _new_node(other, "winner")
        other.execute(
            update(gpus)
            .where(gpus.c.uuid == uuid)
            .values(node_id=winner, last_seen=datetime.now(UTC))
        )
        _refused_after_waiting(pg, other, _claim("late", "shared"))

    assert _stored(pg, uuid) == {
        "owner": "winner",
        "blocks from": {"old"},
        "nodes": ["old", "winner"],
        "gpu_moved events": 0,
    }
