"""The sample writer: every field stored in its type in the blocks (binary COPY on PostgreSQL),
and the GPU and boot keys it remembers are only those of committed rows."""

from __future__ import annotations

import hashlib
import json
import math
import uuid as uuidlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.factories import make_batch
from tests.stored_samples import stored_samples

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.ingest import store as ingest
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.telemetry import SAMPLE_FIELDS, Batch

NOW = datetime(2026, 6, 15, 12, tzinfo=UTC)


@pytest.fixture
def storage(database_url: str) -> Iterator[Database]:
    db = Database(make_engine(ServerSettings(database_url=database_url)))
    upgrade(db.engine)
    yield db
    db.dispose()


def _store(db: Database, raw: dict[str, Any]) -> None:
    body = json.dumps(raw).encode()
    batch = Batch.model_validate_json(body)
    store_batch(db, batch, content_sha256=hashlib.sha256(body).hexdigest(), now=NOW)


def _stored(db: Database) -> list[dict[str, Any]]:
    """Every stored sample, in the order stored."""
    with db.read() as conn:
        return sorted(stored_samples(conn), key=lambda s: (s["block_id"], s["ts"]))


def _extreme_sample(uuid: str) -> dict[str, Any]:
    """Every field at a value its column must hold: the wire's bounds, awkward fractions."""
    sample: dict[str, Any] = {"uuid": uuid, "ts": NOW.isoformat()}
    for spec in SAMPLE_FIELDS:
        if spec.kind == "flag":
            sample[spec.name] = True
        elif spec.is_integer:
            sample[spec.name] = 2**63 - 1  # the wire's largest counter
        elif spec.name in ("pcie_link_gen", "pcie_link_width", "gpu_recovery_action"):
            sample[spec.name] = {"pcie_link_gen": 16, "pcie_link_width": 64}.get(spec.name, 255)
        elif spec.name in ("fb_used_mib", "fb_total_mib"):
            sample[spec.name] = 1.7e308  # unbounded on the wire: a double
        elif spec.name.endswith("_pct"):
            sample[spec.name] = 99.123456789
        elif spec.name.endswith("_temp_c"):
            sample[spec.name] = 87.123456789
        else:
            sample[spec.name] = 712.345678901
    return sample


def test_every_field_is_stored_in_its_type(storage: Database) -> None:
    raw = make_batch("node-a", gpus=1, start=NOW, batch_id=str(uuidlib.uuid4()))
    sent = _extreme_sample(raw["gpus"][0]["uuid"])
    raw["samples"] = [sent, {"uuid": sent["uuid"], "ts": (NOW + timedelta(seconds=10)).isoformat()}]
    _store(storage, raw)
    full, bare = _stored(storage)
    assert (full["gpu_uuid"], full["boot_id"], full["ts"]) == (sent["uuid"], "boot-1", NOW)
    for spec in SAMPLE_FIELDS:
        value, stored = sent[spec.name], full[spec.name]
        if isinstance(value, float) and value < 1e6:
            assert math.isclose(stored, value, rel_tol=1e-7), spec.name  # float32: 7 digits
        else:
            assert stored == value, spec.name
        assert bare[spec.name] is None, spec.name  # not reported stays null, never 0


def test_keys_of_a_rolled_back_batch_are_not_remembered(
    storage: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch registers GPU X and boot b2, then fails: nothing of it stays, and on SQLite the
    next new GPU gets the number X had. X's later samples must still be X's."""
    db = storage
    _store(db, make_batch("node-a", gpus=1, start=NOW - timedelta(minutes=5)))

    def fail(*_args: Any) -> None:
        raise RuntimeError("the database refused the events")

    x = make_batch("node-b", gpus=1, start=NOW - timedelta(minutes=4), boot_id="b2")
    with monkeypatch.context() as patched:
        patched.setattr(ingest, "_insert_events", fail)
        with pytest.raises(RuntimeError):
            _store(db, x)
    assert len(_stored(db)) == 1
    y = make_batch("node-c", gpus=1, start=NOW - timedelta(minutes=3), boot_id="b3")
    _store(db, y)
    x_again = make_batch("node-b", gpus=1, start=NOW - timedelta(minutes=2), boot_id="b2")
    _store(db, x_again)
    _store(db, make_batch("node-b", gpus=1, start=NOW - timedelta(minutes=1), boot_id="b2"))
    rows = _stored(db)
    assert [(r["gpu_uuid"], r["boot_id"]) for r in rows[1:]] == [
        (y["gpus"][0]["uuid"], "b3"),
        (x["gpus"][0]["uuid"], "b2"),
        (x["gpus"][0]["uuid"], "b2"),
    ]
