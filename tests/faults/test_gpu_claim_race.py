"""Many nodes claiming one GPU at the same moment, against a real `fleetwatch server` process, on
SQLite and on PostgreSQL: one node owns a GPU, whatever the timing.

Twenty nodes new to the server push at once (threads released by one barrier, one HTTP client
each) a batch declaring their own GPU and one GPU UUID no node declared before. Exactly one push
is stored; the other nineteen get the 409 a sequential claim of the winner's GPU gets, and
nothing of theirs is stored: neither node, nor GPU, nor sample block. The same holds when the
GPU is known but its node went silent about it (it moved): one claimant moves it, with one
``gpu_moved`` event. Routine pushes of known nodes sent in the same instant (PostgreSQL groups
them into shared transactions), one of them claiming a GPU another node reports, are each
answered as they would be alone. Each race runs a few rounds, so that the pushes do overlap.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import bindparam, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database, make_engine
from tests.factories import gpu_uuid, make_batch, make_gpu, make_sample
from tests.integration.live import LiveServer, create_token, live_server

Batch = dict[str, Any]

CLAIMANTS = 20
ROUNDS = 3
BYSTANDERS = 4
# Ten minutes between reports: a node owns its GPUs for 30 minutes after its last report, far
# longer than any push of the race takes on a loaded machine.
INTERVAL_S = 600.0


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    agent = create_token(database_url, "agent")
    with live_server(database_url, tmp_path) as live:
        yield live, agent


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(make_engine(ServerSettings(database_url=database_url)))
    try:
        yield database
    finally:
        database.dispose()


def _claim(node: str, shared: dict[str, Any]) -> Batch:
    """``node``'s batch: its own GPU and the shared one, a sample of each."""
    batch = make_batch(node, gpus=1, interval_s=INTERVAL_S)
    batch["gpus"].append(shared)
    batch["samples"].append(make_sample(shared["uuid"], utcnow() - timedelta(seconds=5)))
    return batch


def _race(live: LiveServer, token: str, batches: list[Batch]) -> list[httpx.Response]:
    """Post every batch at once, each from its own client; the answers in order."""
    barrier = threading.Barrier(len(batches))

    def post(batch: Batch) -> httpx.Response:
        with live.client(token) as client:
            client.get("/readyz").raise_for_status()  # connected before the start
            barrier.wait(timeout=120)
            return client.post("/v1/ingest", json=batch)

    with ThreadPoolExecutor(len(batches)) as pool:
        return list(pool.map(post, batches))


def _same_claim(body: dict[str, Any]) -> dict[str, Any]:
    """A 409's body without how many seconds ago the owner last reported the GPU."""
    return {
        **body,
        "detail": [
            {**d, "msg": re.sub(r"last -?\d+ s ago", "last N s ago", d["msg"])}
            for d in body["detail"]
        ],
    }


def _owners(db: Database, uuid: str) -> tuple[str | None, set[str]]:
    """The node the GPU's row names, and the nodes its sample blocks were stored under."""
    with db.read() as conn:
        owner = conn.execute(
            text("SELECT n.name FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE g.uuid = :u"),
            {"u": uuid},
        ).scalar()
        blocks = conn.execute(
            text(
                "SELECT DISTINCT n.name FROM gpu_sample_blocks b JOIN gpus g ON g.id = b.gpu_id "
                "JOIN nodes n ON n.id = b.node_id WHERE g.uuid = :u"
            ),
            {"u": uuid},
        ).scalars()
        return owner, set(blocks)


def _stored_of(db: Database, nodes: list[str]) -> dict[str, int]:
    """Rows of anything the named nodes' batches would have stored."""
    own_gpus = [gpu_uuid(node, 0) for node in nodes]
    queries = {
        "nodes": ("SELECT count(*) FROM nodes WHERE name IN :names", {"names": nodes}),
        "gpus": ("SELECT count(*) FROM gpus WHERE uuid IN :uuids", {"uuids": own_gpus}),
        "blocks": (
            "SELECT count(*) FROM gpu_sample_blocks b JOIN gpus g ON g.id = b.gpu_id "
            "WHERE g.uuid IN :uuids",
            {"uuids": own_gpus},
        ),
    }
    with db.read() as conn:
        counts = {}
        for name, (sql, params) in queries.items():
            statement = text(sql).bindparams(*(bindparam(k, expanding=True) for k in params))
            counts[name] = conn.execute(statement, params).scalar_one()
        return counts


def _events(db: Database, kind: str, uuid: str) -> list[str]:
    """Nodes of the events of ``kind`` about the GPU."""
    with db.read() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT n.name FROM events e JOIN nodes n ON n.id = e.node_id "
                    "WHERE e.kind = :k AND e.gpu_uuid = :u"
                ),
                {"k": kind, "u": uuid},
            ).scalars()
        )


def _blocks_per_node(db: Database, nodes: list[str]) -> dict[str, int]:
    with db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT n.name, count(*) FROM gpu_sample_blocks b "
                "JOIN nodes n ON n.id = b.node_id GROUP BY n.name"
            )
        ).all()
    counts = {name: int(count) for name, count in rows}
    return {node: counts.get(node, 0) for node in nodes}


def _check_one_winner(
    answers: list[httpx.Response], claimants: list[str], sequential: httpx.Response
) -> str:
    """The winner's name, once exactly one claimant got 200 and the others a sequential
    claim's 409."""
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 1, 409: CLAIMANTS - 1}, [(a.status_code, a.text) for a in answers]
    winner = next(node for node, a in zip(claimants, answers, strict=True) if a.status_code == 200)
    assert sequential.status_code == 409, sequential.text
    expected = _same_claim(sequential.json())
    assert f"node {winner!r}" in expected["detail"][0]["msg"], expected
    for answer in answers:
        if answer.status_code == 409:
            assert _same_claim(answer.json()) == expected
    return winner


@pytest.mark.slow
def test_one_of_many_new_nodes_claiming_one_new_gpu_at_once_owns_it(
    server: tuple[LiveServer, str], db: Database
) -> None:
    live, token = server
    bystanders = [f"steady-{i}" for i in range(BYSTANDERS)]
    with live.client(token) as client:
        for node in bystanders:
            batch = make_batch(node, gpus=2, interval_s=INTERVAL_S)
            assert client.post("/v1/ingest", json=batch).status_code == 200, node

    for round_ in range(ROUNDS):
        shared = make_gpu(f"shared-{round_}", 1)
        claimants = [f"r{round_}-node-{i:02d}" for i in range(CLAIMANTS)]
        # Routine pushes of known nodes in the same instant, one claiming another's GPU: a
        # refused push must not take the others of its group with it.
        thief = make_batch(bystanders[0], gpus=2, interval_s=INTERVAL_S)
        thief["gpus"][1] = make_gpu(bystanders[1], 1)
        thief["samples"][1]["uuid"] = thief["gpus"][1]["uuid"]
        routine = [make_batch(node, gpus=2, interval_s=INTERVAL_S) for node in bystanders[1:]]
        blocks_before = _blocks_per_node(db, bystanders)

        answers = _race(
            live, token, [_claim(node, shared) for node in claimants] + [thief, *routine]
        )
        claims, (refused, *stored) = answers[:CLAIMANTS], answers[CLAIMANTS:]
        with live.client(token) as client:
            sequential = client.post("/v1/ingest", json=_claim(f"r{round_}-late", shared))
        winner = _check_one_winner(claims, claimants, sequential)

        assert _owners(db, shared["uuid"]) == (winner, {winner})
        losers = [node for node in claimants if node != winner] + [f"r{round_}-late"]
        assert _stored_of(db, losers) == {"nodes": 0, "gpus": 0, "blocks": 0}
        assert _events(db, "gpu_moved", shared["uuid"]) == []
        assert refused.status_code == 409, refused.text
        assert [a.status_code for a in stored] == [200] * len(stored), [a.text for a in stored]
        blocks_after = _blocks_per_node(db, bystanders)
        assert blocks_after == {
            node: blocks_before[node] + (2 if node in bystanders[1:] else 0) for node in bystanders
        }


@pytest.mark.slow
def test_one_of_many_nodes_claiming_a_gpu_that_moved_at_once_owns_it(
    server: tuple[LiveServer, str], db: Database
) -> None:
    live, token = server
    for round_ in range(ROUNDS):
        old = f"r{round_}-old-owner"
        moving = make_gpu(old, 1)
        with live.client(token) as client:
            first = make_batch(old, gpus=0, interval_s=INTERVAL_S)
            first["gpus"] = [moving]
            first["samples"] = [make_sample(moving["uuid"], utcnow() - timedelta(seconds=5))]
            assert client.post("/v1/ingest", json=first).status_code == 200
        with db.write() as conn:  # the old node has been silent about it for a day
            conn.execute(
                text("UPDATE gpus SET last_seen = :t WHERE uuid = :u"),
                {"t": utcnow() - timedelta(days=1), "u": moving["uuid"]},
            )
        claimants = [f"r{round_}-node-{i:02d}" for i in range(CLAIMANTS)]

        answers = _race(live, token, [_claim(node, moving) for node in claimants])
        with live.client(token) as client:
            sequential = client.post("/v1/ingest", json=_claim(f"r{round_}-late", moving))
        winner = _check_one_winner(answers, claimants, sequential)

        assert _owners(db, moving["uuid"]) == (winner, {old, winner})
        assert _events(db, "gpu_moved", moving["uuid"]) == [winner]
        losers = [node for node in claimants if node != winner] + [f"r{round_}-late"]
        assert _stored_of(db, losers) == {"nodes": 0, "gpus": 0, "blocks": 0}
