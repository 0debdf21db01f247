"""The judged sample columns read from PostgreSQL as packed arrays, not as row objects.

The judge's routine pass reads every sample the fleet stored since its last pass (at 100,000
GPUs and a 10 s interval, 300,000 rows every 30 s). Fetched as rows, each costs a Python tuple
and one object per value before numpy sees it: that was most of a pass. Here PostgreSQL packs
each column of a chunk of rows into one ``bytea`` (``string_agg`` of the type's binary send
function, big-endian and fixed width), and numpy reads it without a Python object per value.

A chunk is one result row: the columns ``id``, ``gpu_id``, ``ts`` (``timestamptz_send``:
microseconds since 2000-01-01 UTC), ``boot`` (the ``node_boots`` key, -1 for none), a bit mask
of the fields not reported (bit ``j``: field ``j`` is NULL; the field's own column then holds
0), then one column per field. Chunks come in time order (``row_number() OVER (ORDER BY ts)``)
and each column of a chunk in the same row order, as one aggregate pass reads them.

What the rules see is what the row reader gives them: integers and booleans are sent as they
are stored, and a ``real`` column as ``real::text::float8``, the decimal PostgreSQL prints for
it read as a float64, which is what psycopg's text loader makes of the row reader's value (55.3,
not the float32's 55.29999923706055).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import REAL, BigInteger, Boolean, Connection, Float, Integer, SmallInteger
from sqlalchemy.types import TypeEngine

from fleetwatch.server.db.tables import gpu_samples

__all__ = ["PackedChunk", "packed_samples", "reads_packed"]

# Memory for each sort of the packed read (see packed_samples).
_WORK_MEM = "128MB"
# Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
_PG_EPOCH_US = 946_684_800 * 1_000_000


@dataclass(frozen=True, slots=True)
class PackedChunk:
    """A chunk of sample rows, one array per column (``values``: float64, NaN where the field
    was not reported; ``raw``: the column as sent, for values float64 cannot hold exactly)."""

    ids: NDArray[np.int64]
    gpu_ids: NDArray[np.int64]
    ts_us: NDArray[np.int64]  # since the Unix epoch
    boots: NDArray[np.int64]  # node_boots.id, -1: none
    values: list[NDArray[np.float64]]
    raw: list[NDArray[Any]]


def reads_packed(conn: Connection) -> bool:
    """Whether ``conn`` can read packed samples (PostgreSQL through psycopg)."""
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


# Per column type, most specific first (BigInteger and SmallInteger are Integers, REAL is a
# Float): the SQL that sends a value fixed width, NULL as 0 ("{}" is the column), and its numpy
# dtype. A real goes through text, for the reason the module's docstring gives.
_SENDS: tuple[tuple[type[TypeEngine[Any]], str, str], ...] = (
    (Boolean, "boolsend(COALESCE({}, false))", "u1"),
    (SmallInteger, "int2send(COALESCE({}, 0)::int2)", ">i2"),
    (BigInteger, "int8send(COALESCE({}, 0)::int8)", ">i8"),
    (Integer, "int4send(COALESCE({}, 0)::int4)", ">i4"),
    (REAL, "float8send(COALESCE({}::text::float8, 0::float8))", ">f8"),
    (Float, "float8send(COALESCE({}, 0)::float8)", ">f8"),
)


def _send(name: str) -> tuple[str, str]:
    """The SQL that sends field ``name`` fixed width (0 for NULL) and the numpy dtype of it."""
    kind = gpu_samples.c[name].type
    for base, template, dtype in _SENDS:
        if isinstance(kind, base):
            return template.format(f's."{name}"'), dtype
    raise TypeError(f"gpu_samples.{name}: no packed form for {kind!r}")


def _query(fields: Sequence[str], where: str) -> tuple[str, list[str]]:
    sends = [_send(name) for name in fields]
    nulls = " + ".join(
        f'(CASE WHEN s."{name}" IS NULL THEN {1 << j} ELSE 0 END)' for j, name in enumerate(fields)
    )
    packed = ", ".join(f"{send} AS f{j}" for j, (send, _) in enumerate(sends))
    aggregates = ", ".join(f"string_agg(f{j}, ''::bytea)" for j in range(len(fields)))
    sql = (
        "SELECT count(*), string_agg(int8send(id), ''::bytea), "
        "string_agg(int4send(gpu_id), ''::bytea), string_agg(timestamptz_send(ts), ''::bytea), "
        "string_agg(int4send(boot), ''::bytea), string_agg(int4send(nulls), ''::bytea), "
        f"{aggregates} FROM ("
        "SELECT s.id, s.gpu_id, s.ts, COALESCE(s.boot, -1) AS boot, "
        f"({nulls}) AS nulls, {packed}, "
        "(row_number() OVER (ORDER BY s.ts) - 1) / %(chunk)s AS chunk "
        "FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
        f"WHERE {where} AND s.ts <= %(until)s"
        ") q GROUP BY chunk ORDER BY chunk"
    )
    return sql, [dtype for _, dtype in sends]


def packed_samples(
    conn: Connection,
    fields: Sequence[str],
    *,
    until: datetime,
    since: datetime | None = None,
    after_id: int | None = None,
    chunk: int = 100_000,
) -> Iterator[PackedChunk]:
    """The samples of known GPUs (those with a ``gpus`` row) with ``ts <= until`` and either
    ``ts >= since`` or ``id > after_id`` (exactly one of them), in chunks of ``chunk`` rows in
    time order; ``fields`` in the order asked for. One chunk in memory at a time; call within a
    transaction (the cursor lives in it)."""
    if (since is None) == (after_id is None):
        raise ValueError("give exactly one of since and after_id")
    where = "s.ts >= %(since)s" if since is not None else "s.id > %(after_id)s"
    sql, dtypes = _query(fields, where)
    params = {"chunk": chunk, "until": until, "since": since, "after_id": after_id}
    raw_conn = conn.connection.driver_connection
    assert raw_conn is not None
    # The query sorts the rows twice (by time, then by chunk). PostgreSQL's default 4 MB per
    # sort spills a 300,000-row pass (30 s of a 100,000-GPU fleet) to disk as two external
    # merges; in memory (about 70 MB for them) the read took 30 % less time. SET LOCAL: for
    # this transaction only.
    raw_conn.execute(f"SET LOCAL work_mem = '{_WORK_MEM}'")
    # A server-side cursor fetching one chunk at a time: between chunks the connection is free
    # for the caller's own queries (a streamed result would hold it until the last row).
    with raw_conn.cursor("fleetwatch_packed_samples", binary=True) as cursor:
        cursor.itersize = 1
        cursor.execute(sql, params)
        while (row := cursor.fetchone()) is not None:
            yield _unpacked(row, dtypes)


def _unpacked(row: Sequence[Any], dtypes: Sequence[str]) -> PackedChunk:
    nulls = np.frombuffer(row[5], ">i4")
    values, raw = [], []
    for j, dtype in enumerate(dtypes):
        sent = np.frombuffer(row[6 + j], dtype)
        floats = sent.astype(np.float64)
        floats[(nulls & (1 << j)) != 0] = np.nan
        values.append(floats)
        raw.append(sent)
    return PackedChunk(
        ids=np.frombuffer(row[1], ">i8").astype(np.int64),
        gpu_ids=np.frombuffer(row[2], ">i4").astype(np.int64),
        ts_us=np.frombuffer(row[3], ">i8").astype(np.int64) + _PG_EPOCH_US,
        boots=np.frombuffer(row[4], ">i4").astype(np.int64),
        values=values,
        raw=raw,
    )
