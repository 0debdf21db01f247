"""Group commit of routine pushes on PostgreSQL (server/ingest/group_store.py, ingest_writer.py).

Real PostgreSQL throughout: the group path exists only there. The proof that a group stores what
each push's own transaction stores is a comparison: the same pushes for two fleets that differ
only in their names, one fleet stored push by push through ``store_batch``, the other in groups,
then every stored row of both compared with the names mapped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from tests.conftest import _truncate, bearer
from tests.factories import make_batch
from tests.stored_samples import stored_samples

from fleetwatch.config import ServerSettings
from fleetwatch.errors import GpuClaimed
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.ingest.batch_decoder import decode_batch, ingest_limits
from fleetwatch.server.ingest.batch_structs import BatchStruct
from fleetwatch.server.ingest.group_store import GroupedBatch, is_routine, store_group
from fleetwatch.server.ingest.group_writer import GroupWriter
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.server.repo.sample_reader import count_samples

pytestmark = pytest.mark.postgres

START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
def pg(migrated_postgres_url: str) -> Iterator[Database]:
    _truncate(migrated_postgres_url)
    db = Database(make_engine(ServerSettings(database_url=migrated_postgres_url)))
    yield db
    db.dispose()


def _item(batch: dict[str, Any]) -> GroupedBatch:
    body = json.dumps(batch).encode()
    limits = ingest_limits(ServerSettings(), datetime.now(UTC))
    return GroupedBatch(decode_batch(body, limits), hashlib.sha256(body).hexdigest())


def _alone(db: Database, item: GroupedBatch) -> None:
    store_batch(db, item.batch, content_sha256=item.content_sha256, now=datetime.now(UTC))


def _push(node: str, push: int, *, ticks: int = 6, **kwargs: Any) -> dict[str, Any]:
    start = START + timedelta(seconds=60 * push)
    batch = make_batch(node, gpus=4, ticks=ticks, start=start, **kwargs)
    for i, sample in enumerate(batch["samples"]):  # values that differ sample by sample
        sample["gpu_temp_c"] = 40.0 + (push * 7 + i) % 23
        sample["energy_mj"] = 10_000_000 * push + 1000 * i
    return batch


def _stored(db: Database, prefix: str) -> dict[str, Any]:
    """Every row the pushes of nodes named ``prefix``* wrote, keyed by what does not depend on
    the name (the node's suffix, the GPU index)."""
    with db.read() as conn:
        node_rows = conn.execute(
            text(
                "SELECT name, labels, interval_s, agent_version, boot_id FROM nodes "
                "WHERE name LIKE :p ORDER BY name"
            ),
            {"p": f"{prefix}%"},
        ).all()
        gpu_rows = conn.execute(
            text(
                'SELECT n.name, g."index", g.serial IS NOT NULL, g.pci_bus_id, g.name, '
                "g.driver_version, g.vbios_version, g.latest_ts, g.latest FROM gpus g "
                "JOIN nodes n ON n.id = g.node_id WHERE n.name LIKE :p ORDER BY n.name, 2"
            ),
            {"p": f"{prefix}%"},
        ).all()
        samples = [
            (s["node"], *(v for k, v in s.items() if k not in _KEYS))
            for s in stored_samples(conn, node_prefix=prefix)
        ]
        claims = conn.execute(
            text(
                "SELECT n.name, i.samples, i.events FROM ingest_batches i "
                "JOIN nodes n ON n.id = i.node_id WHERE n.name LIKE :p ORDER BY 1, 2"
            ),
            {"p": f"{prefix}%"},
        ).all()

    def unnamed(rows: Any) -> list[tuple[Any, ...]]:
        return [(row[0].removeprefix(prefix), *row[1:]) for row in rows]

    return {
        "nodes": unnamed(node_rows),
        "gpus": unnamed(gpu_rows),
        "samples": unnamed(samples),
        "claims": unnamed(claims),
    }


def test_a_group_stores_what_each_push_alone_would(pg: Database) -> None:
    nodes = [f"n{i}" for i in range(6)]
    for node in nodes:  # the first push registers the node and its GPUs: never grouped
        _alone(pg, _item(_push(f"alone-{node}", 0)))
        _alone(pg, _item(_push(f"group-{node}", 0)))
    for push in range(1, 4):
        for node in nodes:
            _alone(pg, _item(_push(f"alone-{node}", push)))
        results = store_group(pg, [_item(_push(f"group-{n}", push)) for n in nodes], now=START)
        assert all(r is not None and r.samples == 24 and not r.duplicate for r in results)
    alone, grouped = _stored(pg, "alone-"), _stored(pg, "group-")
    assert len(grouped["samples"]) == 6 * 4 * 24
    assert len(grouped["claims"]) == 6 * 4
    assert grouped == alone


def test_a_group_leaves_out_what_is_not_routine_and_stores_none_of_it(pg: Database) -> None:
    for node in ("a", "b", "c", "d", "e"):
        _alone(pg, _item(_push(node, 0)))
    stored_before = _item(_push("a", 1))
    _alone(pg, stored_before)
    other_gpu = _push("e", 1)
    other_gpu["gpus"][0] = _push("b", 1)["gpus"][0]  # a GPU node b owns
    other_gpu["samples"][0]["uuid"] = other_gpu["gpus"][0]["uuid"]
    changed = _push("d", 1)
    changed["gpus"][1]["driver_version"] = "560.35.03"  # a driver upgrade
    items = [
        _item(_push("c", 1)),  # routine
        stored_before,  # a replay of a stored batch
        _item(_push("new", 1)),  # a node never seen
        _item(_push("b", 1, boot_id="boot-2")),  # a reboot
        _item(other_gpu),  # a GPU of another node
        _item(changed),  # an identity change
        _item(_push("c", 2)),  # its node already in the group
        _item(_push("b", 2, events=[{"kind": "xid", "ts": START.isoformat(), "xid": 13}])),
    ]
    before = _counts(pg)
    results = store_group(pg, items, now=START)
    assert [r is not None for r in results] == [True] + [False] * 7
    after = _counts(pg)
    assert after["samples"] - before["samples"] == 24, "only the routine push's samples"
    assert after["claims"] - before["claims"] == 1, "the others' claims are withdrawn"
    assert after["nodes"] == before["nodes"] and after["gpus"] == before["gpus"]
    for item in items[1:]:  # each is then stored (or answered) by store_batch, as ever
        if item is items[4]:
            with pytest.raises(GpuClaimed):  # 409: node b reports that GPU right now
                _alone(pg, item)
        else:
            _alone(pg, item)
    final = _counts(pg)
    assert final["samples"] - after["samples"] == 24 * 5, "all but the replay and the claimed GPU"


# What names a stored sample's node and GPU otherwise than by name and index.
_KEYS = ("node", "block_id", "gpu_id", "gpu_uuid", "node_id")


def _counts(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return {
            "samples": count_samples(conn),
            "claims": conn.execute(text("SELECT count(*) FROM ingest_batches")).scalar_one(),
            "nodes": conn.execute(text("SELECT count(*) FROM nodes")).scalar_one(),
            "gpus": conn.execute(text("SELECT count(*) FROM gpus")).scalar_one(),
        }


def test_a_failing_group_stores_nothing(pg: Database) -> None:
    for node in ("a", "b"):
        _alone(pg, _item(_push(node, 0)))
    good, refused = _item(_push("a", 1)), _item(_push("b", 1))
    assert isinstance(refused.batch, BatchStruct)
    refused.batch.samples[0].energy_mj = 2**70  # past the decoder: no bigint holds it
    before = _counts(pg)
    with pytest.raises(Exception, match="too (big|large)|out of range"):
        store_group(pg, [good, refused], now=START)
    assert _counts(pg) == before, "the good push's rows went with the transaction"


def test_the_writer_sends_every_push_of_a_failed_group_its_own_way(
    migrated_postgres_url: str,
) -> None:
    base = ServerSettings(database_url=migrated_postgres_url).database_url
    missing = base.rsplit("/", 1)[0] + "/fleetwatch_no_such_database"
    db = Database(make_engine(ServerSettings(database_url=missing)))
    groups: list[tuple[int, int]] = []
    writer = GroupWriter(db, max_batches=8, on_group=lambda n, g: groups.append((n, g)))
    writer.start()
    try:

        async def three() -> list[Any]:
            pushes = [_item(_push(node, 1)) for node in ("a", "b", "c")]
            return list(await asyncio.gather(*(writer.store(p) for p in pushes)))

        assert asyncio.run(three()) == [None, None, None]
    finally:
        writer.stop()
        db.dispose()
    assert sum(n for n, _ in groups) == 3 and all(g == 0 for _, g in groups)


def test_routine_means_samples_without_events_or_ports() -> None:
    assert is_routine(_item(_push("a", 1)).batch)
    assert not is_routine(_item(_push("a", 1, ticks=0)).batch)
    xid = [{"kind": "xid", "ts": START.isoformat(), "xid": 79}]
    assert not is_routine(_item(_push("a", 1, events=xid)).batch)


def test_concurrent_pushes_through_http_share_transactions_and_are_stored_once(
    migrated_postgres_url: str,
) -> None:
    _truncate(migrated_postgres_url)
    settings = ServerSettings(  # type: ignore[call-arg]
        database_url=migrated_postgres_url, background_jobs=False, _env_file=None
    )
    nodes = [f"h{i}" for i in range(24)]
    with TestClient(create_app(settings)) as client:
        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            token, _ = create_token(conn, name="agent", scope="agent")
            reader, _ = create_token(conn, name="reader", scope="read")
        headers = bearer(token)
        for node in nodes:
            assert (
                client.post("/v1/ingest", json=_push(node, 0), headers=headers).status_code == 200
            )
        pushes = [_push(node, p) for p in range(1, 4) for node in nodes]
        replays = pushes[:10]

        async def send_all() -> list[int]:
            import httpx

            transport = httpx.ASGITransport(app=client.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                answers = await asyncio.gather(
                    *(http.post("/v1/ingest", json=b, headers=headers) for b in pushes + replays)
                )
            return [a.status_code for a in answers]

        assert set(client.portal.call(send_all)) == {200}  # type: ignore[union-attr]
        page = client.get("/metrics", headers=bearer(reader)).text
        with db.read() as conn:  # while the app's engine is still open
            stored = count_samples(conn)
            claims = conn.execute(text("SELECT count(*) FROM ingest_batches")).scalar_one()
    assert stored == 24 * len(nodes) + 24 * len(pushes), "each push once, replays not again"
    assert claims == len(nodes) + len(pushes)
    grouped = [
        line for line in page.splitlines() if line.startswith("fleetwatch_ingest_group_batches_")
    ]
    assert any(line.startswith("fleetwatch_ingest_group_batches_count") for line in grouped)
    total = next(float(line.split()[-1]) for line in grouped if "_sum" in line)
    count = next(float(line.split()[-1]) for line in grouped if "_count" in line)
    assert total >= len(pushes), "every routine push went through a group"
    assert count < total, "some groups held more than one push"


@pytest.mark.parametrize("path", ["alone", "group"])
def test_a_transaction_that_only_references_a_node_never_holds_its_pushes(
    pg: Database, migrated_postgres_url: str, path: str
) -> None:
    # A background pass inserting rows that reference nodes (events, rollups) holds KEY SHARE on
    # each of them until it commits; before FOR NO KEY UPDATE every push of those nodes waited.
    import threading

    import psycopg

    _alone(pg, _item(_push("a", 0)))
    dsn = ServerSettings(database_url=migrated_postgres_url).database_url
    holder = psycopg.connect(dsn.replace("postgresql+psycopg://", "postgresql://"))
    try:
        holder.execute("SELECT id FROM nodes WHERE name = 'a' FOR KEY SHARE")  # left open
        item = _item(_push("a", 1))
        done = threading.Event()

        def store() -> None:
            if path == "alone":
                _alone(pg, item)
            else:
                assert store_group(pg, [item], now=START)[0] is not None
            done.set()

        worker = threading.Thread(target=store, daemon=True)
        worker.start()
        stored_while_held = done.wait(timeout=60)
    finally:
        holder.rollback()
        holder.close()
    worker.join(timeout=60)
    assert stored_while_held, "the push waited for a transaction that only held the node's key"


def test_a_lingering_writer_gathers_pushes_that_arrive_one_after_the_other(pg: Database) -> None:
    for node in ("a", "b"):
        _alone(pg, _item(_push(node, 0)))  # registered: their next pushes are routine
    groups: list[tuple[int, int]] = []
    # A long linger that max_batches cuts short: the group closes when the second push arrives,
    # whatever the scheduling, so nothing here races a clock.
    writer = GroupWriter(
        pg, max_batches=2, linger_s=60.0, on_group=lambda n, g: groups.append((n, g))
    )
    writer.start()
    try:

        async def one_then_another() -> list[Any]:
            first = asyncio.ensure_future(writer.store(_item(_push("a", 1))))
            await asyncio.sleep(0.01)  # the writer has (most likely) taken the first and waits
            second = asyncio.ensure_future(writer.store(_item(_push("b", 1))))
            return list(await asyncio.gather(first, second))

        results = asyncio.run(one_then_another())
    finally:
        writer.stop()
    assert all(r is not None and r.samples == 24 for r in results)
    assert groups == [(2, 2)]
    with pg.read() as conn:
        assert count_samples(conn) == 4 * 6 * 2 + 4 * 6 * 2


def test_a_lingering_writer_stores_a_lone_push_when_the_linger_ends(pg: Database) -> None:
    _alone(pg, _item(_push("a", 0)))
    groups: list[tuple[int, int]] = []
    writer = GroupWriter(
        pg, max_batches=8, linger_s=0.05, on_group=lambda n, g: groups.append((n, g))
    )
    writer.start()
    try:
        result = asyncio.run(writer.store(_item(_push("a", 1))))
    finally:
        writer.stop()
    assert result is not None and result.samples == 24 and groups == [(1, 1)]
