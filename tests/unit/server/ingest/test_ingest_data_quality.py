"""POST /v1/ingest: one reading per GPU and instant, and one node per GPU UUID.

- A sample repeated with the same GPU and timestamp in one batch is stored once when identical;
  when the two differ the batch is refused with 422 naming both indexes.
- A GPU UUID that another node reported within its last ``unreachable_after_intervals``
  intervals is refused with 409 naming ``gpus.<i>.uuid`` and that node, and one
  ``gpu_uuid_conflict`` event tells operators; a UUID its node has been silent about longer
  moved: accepted, with a ``gpu_moved`` event.

Every test runs on SQLite and on real PostgreSQL.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update
from tests.factories import gpu_uuid, make_batch, make_gpu
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpus

Read = Callable[..., httpx.Response]


def _error(response: httpx.Response, status: int, loc: list[Any]) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert "nothing was stored" in body["error"]
    assert loc in [d["loc"] for d in body["detail"]], body["detail"]
    return body


# -- repeated samples inside one batch ---------------------------------------------------------


def test_ingest_identical_repeated_sample_is_stored_once(
    push: Push, read: Read, db: Database
) -> None:
    batch = make_batch("node-a", gpus=2, ticks=2)
    batch["samples"].insert(3, copy.deepcopy(batch["samples"][0]))
    batch["samples"].append(copy.deepcopy(batch["samples"][0]))
    response = push(batch)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == {"samples": 4, "events": 0}
    assert row_counts(db)["gpu_samples"] == 4
    stored = read(f"/v1/gpus/{gpu_uuid('node-a', 0)}/samples").json()
    assert stored["count"] == 2
    # A replay of the same body is still recognised as the same batch.
    assert push(batch).json()["duplicate"] is True
    assert row_counts(db)["gpu_samples"] == 4


def test_ingest_conflicting_repeated_sample_is_422_naming_both(push: Push, db: Database) -> None:
    batch = make_batch("node-a", gpus=2, ticks=2)
    clash = copy.deepcopy(batch["samples"][1])
    clash["gpu_temp_c"] = 90.0
    batch["samples"].append(clash)  # index 4, same GPU and ts as index 1
    body = _error(push(batch), 422, ["body", "samples", 4])
    assert "samples[1]" in body["detail"][0]["msg"] and "samples[4]" in body["error"]
    assert row_counts(db)["gpu_samples"] == 0 and row_counts(db)["nodes"] == 0
    # Without the clash the same node's batch is stored.
    batch["samples"].pop()
    assert push(batch).status_code == 200
    assert row_counts(db)["gpu_samples"] == 4


def test_ingest_same_instant_in_another_time_zone_is_the_same_sample(
    push: Push, db: Database
) -> None:
    batch = make_batch("node-a", gpus=1)
    again = copy.deepcopy(batch["samples"][0])
    again["ts"] = again["ts"].replace("+00:00", "Z")
    again["power_w"] = 1.0
    batch["samples"].append(again)
    _error(push(batch), 422, ["body", "samples", 1])
    assert row_counts(db)["gpu_samples"] == 0


def test_ingest_gpu_declared_twice_is_kept_once_or_refused_when_different(
    push: Push, read: Read, db: Database
) -> None:
    batch = make_batch("node-a", gpus=1)
    batch["gpus"].append(copy.deepcopy(batch["gpus"][0]))
    assert push(batch).status_code == 200
    assert row_counts(db)["gpus"] == 1

    other = make_batch("node-a", gpus=1)
    other["gpus"].append({**other["gpus"][0], "index": 5})
    body = _error(push(other), 422, ["body", "gpus", 1])
    assert "gpus[0]" in body["detail"][0]["msg"]
    assert read(f"/v1/gpus/{gpu_uuid('node-a', 0)}").json()["index"] == 0


# -- one GPU UUID, two nodes ---------------------------------------------------------------------


def _clone_of_node_a(gpu_count: int = 2) -> dict[str, Any]:
    """node-b's batch that declares node-a's GPU 0 (a cloned UUID) besides its own GPUs."""
    batch = make_batch("node-b", gpus=gpu_count)
    stolen = make_gpu("node-a", 0)
    batch["gpus"].append(stolen)
    batch["samples"].append({**batch["samples"][0], "uuid": stolen["uuid"]})
    return batch


def _events(read: Read, kind: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = read("/v1/events", kind=kind).json()["data"]
    return data


def test_ingest_gpu_uuid_another_node_reports_now_is_409(
    push: Push, read: Read, db: Database
) -> None:
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    before = row_counts(db)

    body = _error(push(_clone_of_node_a()), 409, ["body", "gpus", 2, "uuid"])
    assert "node-a" in body["error"] and gpu_uuid("node-a", 0) in body["error"]
    assert "node-a" in body["detail"][0]["msg"]
    assert read(f"/v1/gpus/{gpu_uuid('node-a', 0)}").json()["node"] == "node-a"

    # Nothing of node-b's batch is stored; one event on the owning node tells operators.
    after = row_counts(db)
    assert {k: v for k, v in after.items() if k != "events"} == {
        k: v for k, v in before.items() if k != "events"
    }
    conflicts = _events(read, "gpu_uuid_conflict")
    assert len(conflicts) == 1
    assert conflicts[0]["node"] == "node-a"
    assert conflicts[0]["gpu_uuid"] == gpu_uuid("node-a", 0)
    assert conflicts[0]["details"] == {
        "uuid": gpu_uuid("node-a", 0),
        "owned_by": "node-a",
        "reported_by": "node-b",
    }

    # The clone's next batches are refused too, without one event each.
    assert push(_clone_of_node_a()).status_code == 409
    assert len(_events(read, "gpu_uuid_conflict")) == 1

    # node-a keeps reporting, and node-b is stored once it stops claiming the GPU.
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    assert push(make_batch("node-b", gpus=2)).status_code == 200
    assert row_counts(db)["gpu_samples"] == before["gpu_samples"] + 4


def _silence(db: Database, uuid: str, seconds: float) -> None:
    """Make the GPU's owner look silent about it for ``seconds`` (its last report then)."""
    with db.write() as conn:
        conn.execute(
            update(gpus)
            .where(gpus.c.uuid == uuid)
            .values(last_seen=utcnow() - timedelta(seconds=seconds))
        )


def test_ingest_gpu_its_node_went_silent_about_moved(push: Push, read: Read, db: Database) -> None:
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    uuid = gpu_uuid("node-a", 0)
    _silence(db, uuid, 3 * 10.0 + 5)  # node-a's interval is 10 s; 3 intervals by default

    response = push(_clone_of_node_a())
    assert response.status_code == 200, response.text
    assert read(f"/v1/gpus/{uuid}").json()["node"] == "node-b"
    moved = _events(read, "gpu_moved")
    assert len(moved) == 1
    assert moved[0]["node"] == "node-b" and moved[0]["gpu_uuid"] == uuid
    assert moved[0]["details"]["from_node"] == "node-a"
    assert moved[0]["details"]["to_node"] == "node-b"
    assert _events(read, "gpu_uuid_conflict") == []

    # Now node-a, which may have come back with a stale view, is the one refused.
    _error(push(make_batch("node-a", gpus=2)), 409, ["body", "gpus", 0, "uuid"])


def test_ingest_moved_window_follows_unreachable_after_intervals(
    push: Push, read: Read, db: Database, make_client: Callable[..., Any]
) -> None:
    patient = make_client(unreachable_after_intervals=10.0)
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    _silence(db, gpu_uuid("node-a", 0), 35.0)  # past 3 intervals, within 10
    _error(push(_clone_of_node_a(), on=patient), 409, ["body", "gpus", 2, "uuid"])
    assert push(_clone_of_node_a()).status_code == 200  # the default 3 intervals: moved


def test_ingest_samples_of_a_gpu_owned_elsewhere_stay_refused_without_declaring(
    push: Push, db: Database
) -> None:
    # Unchanged behaviour: a sample for another node's GPU, not declared in the batch, is 422.
    assert push(make_batch("node-a", gpus=1)).status_code == 200
    _silence(db, gpu_uuid("node-a", 0), 3600)
    batch = make_batch("node-b", gpus=1)
    batch["samples"].append({**batch["samples"][0], "uuid": gpu_uuid("node-a", 0)})
    _error(push(batch), 422, ["body", "samples", 1, "uuid"])


def test_ingest_conflict_event_is_per_reporting_node(push: Push, read: Read) -> None:
    # Two clones of node-a's GPU on node-b and node-c: each is recorded once.
    assert push(make_batch("node-a", gpus=1)).status_code == 200
    for node in ("node-b", "node-c", "node-b", "node-c"):
        batch = make_batch(node, gpus=1)
        batch["gpus"].append(make_gpu("node-a", 0))
        assert push(batch).status_code == 409
    reporters = sorted(e["details"]["reported_by"] for e in _events(read, "gpu_uuid_conflict"))
    assert reporters == ["node-b", "node-c"]
