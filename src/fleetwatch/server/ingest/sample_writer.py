"""Writing a batch's samples: one block per GPU into ``gpu_sample_blocks``, in bulk.

Each GPU's ticks of the batch become one compressed block
(:mod:`fleetwatch.server.db.sample_blocks`): a push of six ticks of eight GPUs is eight rows.
PostgreSQL gets a binary ``COPY``, routed by the server into the day's partition; SQLite an
``executemany`` insert. Blocks name their GPU and the node's boot by small keys (``gpus.id``,
``node_boots.id``), looked up once per batch and remembered per database once the batch
committed: a committed key never changes (GPUs and boots are never deleted nor renumbered).
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.server.db.partitions import HOLD_DEFAULT_SQL
from fleetwatch.server.db.sample_blocks import encode_blocks
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_sample_blocks, gpus, node_boots
from fleetwatch.server.ingest.batch_view import SampleView
from fleetwatch.server.repo.sample_reader import from_us, to_us
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

__all__ = [
    "BLOCK_COLUMNS",
    "BLOCK_COPY_STATEMENT",
    "BLOCK_COPY_TYPES",
    "LearnedKeys",
    "block_rows",
    "copy_blocks",
    "write_sample_rows",
    "write_samples",
]

BLOCK_COLUMNS = ("gpu_id", "node_id", "boot", "ts0", "ts1", "n", "data")
# The PostgreSQL type of each copied column: binary COPY sends values in the column's own
# binary format, so each must be named.
BLOCK_COPY_TYPES = ("int4", "int4", "int4", "timestamptz", "timestamptz", "int2", "bytea")
BLOCK_COPY_STATEMENT = (
    f"COPY gpu_sample_blocks ({', '.join(BLOCK_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
)

# One C call reads a sample's 34 values as a tuple (a Python loop of getattr cost about as
# much as the rest of the write together); works on the msgspec structs and pydantic models alike.
SAMPLE_VALUES = attrgetter(*SAMPLE_FIELD_NAMES)

_SELECT_GPU_IDS = select(gpus.c.uuid, gpus.c.id).where(
    gpus.c.uuid.in_(bindparam("uuids", expanding=True))
)
_SELECT_BOOT = select(node_boots.c.id).where(
    node_boots.c.node_id == bindparam("node_id"), node_boots.c.boot_id == bindparam("boot_id")
)
_INSERT_BOOT = {
    name: insert_(node_boots)
    .on_conflict_do_nothing(index_elements=["node_id", "boot_id"])
    .returning(node_boots.c.id)
    for name, insert_ in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}


class CommittedKeys:
    """Committed keys of one database: GPU UUID -> gpus.id, (node, boot id) -> node_boots.id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gpus: dict[str, int] = {}
        self.boots: dict[tuple[int, str], int] = {}


@dataclass
class LearnedKeys:
    """Keys a batch looked up, to remember once its transaction committed (a key this
    transaction created could roll back with it, and SQLite would hand its number to the next
    row)."""

    db: Database
    gpus: dict[str, int] = field(default_factory=dict)
    boots: dict[tuple[int, str], int] = field(default_factory=dict)

    def remember(self) -> None:
        """Call after the commit."""
        keys = keys_of(self.db)
        with keys.lock:
            keys.gpus.update(self.gpus)
            keys.boots.update(self.boots)


_KEYS: weakref.WeakKeyDictionary[Database, CommittedKeys] = weakref.WeakKeyDictionary()
_KEYS_LOCK = threading.Lock()


def keys_of(db: Database) -> CommittedKeys:
    with _KEYS_LOCK:
        keys = _KEYS.get(db)
        if keys is None:
            keys = _KEYS[db] = CommittedKeys()
        return keys


def write_samples(
    conn: Connection,
    db: Database,
    samples: Sequence[SampleView],
    node_id: int,
    boot_id: str | None,
    *,
    now: datetime,
) -> LearnedKeys:
    """Insert ``samples`` of node ``node_id`` in this transaction (their GPUs are registered);
    return the keys looked up, for :meth:`LearnedKeys.remember` after the commit."""
    learned = LearnedKeys(db)
    if not samples:
        return learned
    keys = keys_of(db)
    gpu_ids = _gpu_ids(conn, keys, {s.uuid for s in samples}, learned)
    boot = None if boot_id is None else boot_key(conn, keys, node_id, boot_id, now, learned)
    rows = block_rows(samples, gpu_ids, node_id, boot)
    if conn.dialect.name == "postgresql":
        copy_blocks(conn, rows)
    else:
        conn.execute(
            insert(gpu_sample_blocks), [dict(zip(BLOCK_COLUMNS, r, strict=True)) for r in rows]
        )
    return learned


def block_rows(
    samples: Sequence[SampleView], gpu_ids: dict[str, int], node_id: int, boot: int | None
) -> list[tuple[Any, ...]]:
    """The blocks of one batch's samples as rows of :data:`BLOCK_COLUMNS`."""
    blocks = encode_blocks(
        [gpu_ids[s.uuid] for s in samples],
        [to_us(s.ts) for s in samples],
        [SAMPLE_VALUES(s) for s in samples],
    )
    return [
        (b.gpu_key, node_id, boot, from_us(b.ts0_us), from_us(b.ts1_us), b.n, b.data)
        for b in blocks
    ]


def _gpu_ids(
    conn: Connection, keys: CommittedKeys, uuids: set[str], learned: LearnedKeys
) -> dict[str, int]:
    with keys.lock:
        found = {uuid: keys.gpus[uuid] for uuid in uuids if uuid in keys.gpus}
    missing = uuids - found.keys()
    if missing:
        read = {row.uuid: row.id for row in conn.execute(_SELECT_GPU_IDS, {"uuids": list(missing)})}
        found.update(read)
        learned.gpus.update(read)
    return found


def boot_key(
    conn: Connection,
    keys: CommittedKeys,
    node_id: int,
    boot_id: str,
    now: datetime,
    learned: LearnedKeys,
) -> int:
    with keys.lock:
        known = keys.boots.get((node_id, boot_id))
    if known is not None:
        return known
    params = {"node_id": node_id, "boot_id": boot_id}
    found = conn.execute(_SELECT_BOOT, params).scalar()
    if found is None:
        insert_boot = _INSERT_BOOT[conn.dialect.name]
        found = conn.execute(insert_boot, {**params, "first_seen": now}).scalar()
    if found is None:  # another batch of this node inserted it first, and has committed
        found = conn.execute(_SELECT_BOOT, params).scalar_one()
    learned.boots[(node_id, boot_id)] = int(found)
    return int(found)


def copy_blocks(conn: Connection, rows: Iterable[tuple[Any, ...]]) -> None:
    """PostgreSQL's bulk path, inside the SQLAlchemy transaction (same connection). The DEFAULT
    partition is taken first: see :mod:`fleetwatch.server.db.partitions`."""
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor:
        cursor.execute(HOLD_DEFAULT_SQL)
        with cursor.copy(BLOCK_COPY_STATEMENT) as copy:
            copy.set_types(BLOCK_COPY_TYPES)
            for row in rows:
                copy.write_row(row)


def write_sample_rows(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> int:
    """Store samples given one mapping each (``gpu_id``, ``node_id``, ``ts``, optionally
    ``boot``, and fields by name: a field left out was not reported), for tools and tests that
    hold rows rather than a batch; return the samples stored. Each GPU's samples of one node and
    boot become blocks, as a batch's would."""
    runs: dict[tuple[int, int, int | None], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        runs[(int(row["gpu_id"]), int(row["node_id"]), row.get("boot"))].append(row)
    blocks: list[tuple[Any, ...]] = []
    for (gpu_id, node_id, boot), run in runs.items():
        encoded = encode_blocks(
            [gpu_id] * len(run),
            [to_us(row["ts"]) for row in run],
            [tuple(row.get(name) for name in SAMPLE_FIELD_NAMES) for row in run],
        )
        blocks.extend(
            (gpu_id, node_id, boot, from_us(b.ts0_us), from_us(b.ts1_us), b.n, b.data)
            for b in encoded
        )
    if blocks and conn.dialect.name == "postgresql":
        copy_blocks(conn, blocks)
    elif blocks:
        conn.execute(
            insert(gpu_sample_blocks), [dict(zip(BLOCK_COLUMNS, b, strict=True)) for b in blocks]
        )
    return sum(len(run) for run in runs.values())
