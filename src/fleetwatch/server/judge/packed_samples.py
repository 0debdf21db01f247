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
are stored, and a ``real`` column as its four bytes, turned here into the float64 of the decimal
PostgreSQL prints for it (:func:`as_printed`), which is what psycopg's text loader makes of the
row reader's value (55.3, not the float32's 55.29999923706055). PostgreSQL used to do that turn
itself (``real::text::float8``): reading 300,000 rows of nine real columns took it 1,105 to
1,282 ms that way and 404 to 500 ms sent as stored, and the turn here takes 26 ms of CPU
(``benchmarks/real_columns.py``, three runs).
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

__all__ = ["PackedChunk", "as_printed", "packed_samples", "reads_packed"]

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

    def take(self, rows: NDArray[Any]) -> PackedChunk:
        """The chunk's ``rows`` (a mask, or positions in the order wanted)."""
        return PackedChunk(
            ids=self.ids[rows],
            gpu_ids=self.gpu_ids[rows],
            ts_us=self.ts_us[rows],
            boots=self.boots[rows],
            values=[column[rows] for column in self.values],
            raw=[column[rows] for column in self.raw],
        )


def reads_packed(conn: Connection) -> bool:
    """Whether ``conn`` can read packed samples (PostgreSQL through psycopg)."""
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


# Per column type, most specific first (BigInteger and SmallInteger are Integers, REAL is a
# Float): the SQL that sends a value fixed width, NULL as 0 ("{}" is the column), and its numpy
# dtype. A real is turned into the float64 of its printed decimal here (as_printed).
_SENDS: tuple[tuple[type[TypeEngine[Any]], str, str], ...] = (
    (Boolean, "boolsend(COALESCE({}, false))", "u1"),
    (SmallInteger, "int2send(COALESCE({}, 0)::int2)", ">i2"),
    (BigInteger, "int8send(COALESCE({}, 0)::int8)", ">i8"),
    (Integer, "int4send(COALESCE({}, 0)::int4)", ">i4"),
    (REAL, "float4send(COALESCE({}, 0))", ">f4"),
    (Float, "float8send(COALESCE({}, 0)::float8)", ">f8"),
)


def _send(name: str) -> tuple[str, str]:
    """The SQL that sends field ``name`` fixed width (0 for NULL) and the numpy dtype of it."""
    kind = gpu_samples.c[name].type
    for base, template, dtype in _SENDS:
        if isinstance(kind, base):
            return template.format(f's."{name}"'), dtype
    raise TypeError(f"gpu_samples.{name}: no packed form for {kind!r}")


def _query(fields: Sequence[str], where: str, *, by_time: bool = True) -> tuple[str, list[str]]:
    """The packed read of ``fields`` where ``where``. ``by_time``: every row sorted by time and
    cut into chunks of ``%(chunk)s`` rows, each a result row, of known GPUs only (joined to
    ``gpus``). Otherwise one result row of the rows as stored (:func:`_after_id` sorts them):
    the sort, the numbering and the join were 45 % of the database's time for a read, and a
    sample's GPU is always known (ingest registers it in the sample's own transaction, and no
    GPU is ever deleted)."""
    sends = [_send(name) for name in fields]
    nulls = " + ".join(
        f'(CASE WHEN s."{name}" IS NULL THEN {1 << j} ELSE 0 END)' for j, name in enumerate(fields)
    )
    packed = ", ".join(f"{send} AS f{j}" for j, (send, _) in enumerate(sends))
    aggregates = ", ".join(f"string_agg(f{j}, ''::bytea)" for j in range(len(fields)))
    chunked = "(row_number() OVER (ORDER BY s.ts) - 1) / %(chunk)s" if by_time else "0"
    source = "gpu_samples s JOIN gpus g ON g.id = s.gpu_id" if by_time else "gpu_samples s"
    sql = (
        "SELECT count(*), string_agg(int8send(id), ''::bytea), "
        "string_agg(int4send(gpu_id), ''::bytea), string_agg(timestamptz_send(ts), ''::bytea), "
        "string_agg(int4send(boot), ''::bytea), string_agg(int4send(nulls), ''::bytea), "
        f"{aggregates} FROM ("
        "SELECT s.id, s.gpu_id, s.ts, COALESCE(s.boot, -1) AS boot, "
        f"({nulls}) AS nulls, {packed}, {chunked} AS chunk "
        f"FROM {source} WHERE {where} AND s.ts <= %(until)s"
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
    ``ts >= since`` or ``id > after_id`` (exactly one of them); ``fields`` in the order asked
    for. Since a time: chunks of ``chunk`` rows in time order. After an id: the ids in ranges of
    ``chunk`` (chunks of at most that many rows), each in time order, so a GPU's samples come
    in the order they were stored. One chunk in memory at a time; call within a transaction."""
    if (since is None) == (after_id is None):
        raise ValueError("give exactly one of since and after_id")
    raw_conn = conn.connection.driver_connection
    assert raw_conn is not None
    # The query sorts the rows twice (by time, then by chunk). PostgreSQL's default 4 MB per
    # sort spills a 300,000-row pass (30 s of a 100,000-GPU fleet) to disk as two external
    # merges; in memory (about 70 MB for them) the read took 30 % less time. SET LOCAL: for
    # this transaction only.
    raw_conn.execute(f"SET LOCAL work_mem = '{_WORK_MEM}'")
    if after_id is not None:
        yield from _after_id(raw_conn, fields, after_id, until, chunk)
        return
    sql, dtypes = _query(fields, "s.ts >= %(since)s")
    params = {"chunk": chunk, "until": until, "since": since}
    # A server-side cursor fetching one chunk at a time: between chunks the connection is free
    # for the caller's own queries (a streamed result would hold it until the last row).
    with raw_conn.cursor("fleetwatch_packed_samples", binary=True) as cursor:
        cursor.itersize = 1
        cursor.execute(sql, params)
        while (row := cursor.fetchone()) is not None:
            yield _unpacked(row, dtypes)


def _after_id(
    raw_conn: Any, fields: Sequence[str], after_id: int, until: datetime, chunk: int
) -> Iterator[PackedChunk]:
    """The samples after ``after_id``, one range of ``chunk`` ids at a time, each sorted by time
    here. One query over them all, sorted and numbered by time in the database, held a core for
    17 to 24 s of each rollups pass (3 million rows: 5 minutes of 100,000 GPUs) in fleet-scale
    runs while the fleet's pushes waited; ``benchmarks/packed_read_ranges.py`` compares the
    two."""
    sql, dtypes = _query(fields, "s.id > %(after_id)s AND s.id <= %(upto)s", by_time=False)
    newest = raw_conn.execute(_NEWEST_ID).fetchone()[0]
    low = after_id
    while newest is not None and low < newest:
        high = min(low + chunk, newest)
        params = {"until": until, "after_id": low, "upto": high}
        row = raw_conn.cursor(binary=True).execute(sql, params).fetchone()
        low = high
        if row is None:  # a gap (retention dropped those days): on to the next stored id
            after = raw_conn.execute(_NEXT_ID, {"after": high}).fetchone()[0]
            low = newest if after is None else max(high, after - 1)
            continue
        yield _in_time_order(_unpacked(row, dtypes))


def _in_time_order(chunk: PackedChunk) -> PackedChunk:
    """The chunk's rows sorted by time (rows of one time in the order the database gave them)."""
    return chunk.take(np.argsort(chunk.ts_us, kind="stable"))


_NEWEST_ID = "SELECT max(id) FROM gpu_samples"
_NEXT_ID = "SELECT min(id) FROM gpu_samples WHERE id > %(after)s"


# Every float32 at or above this magnitude is an integer; below it, PostgreSQL prints an
# integer-valued real as that integer.
_FLOAT32_INTEGERS = float(2**24)
# Decimal places tried by arithmetic: a float32 below 2**24 has a 24-bit significand and 10**d
# one of d + 1 bits (10**d = 5**d * 2**d, 5**12 < 2**28), so x * 10**d is exact in a float64 for
# d <= 12 and rint of it is the nearest d-place decimal; the division is correctly rounded.
_MAX_PLACES = 12


def as_printed(sent: NDArray[np.float32]) -> NDArray[np.float64]:
    """The float64 of the decimal PostgreSQL prints for each real (its shortest decimal that
    reads back as the same float32), as psycopg's text loader reads it; for every value below
    2**24 in magnitude (the wire bounds every real field to 50,000), equal to
    ``real::text::float8`` (a test holds the two to each other on real PostgreSQL).

    An integer is itself. Otherwise the fewest decimal places d whose nearest d-place decimal
    reads back as the same float32 give the shortest decimal; past ``_MAX_PLACES`` (magnitudes
    below about 1e-5), numpy prints the float32's shortest decimal and reads it back."""
    out = sent.astype(np.float64)
    todo = np.flatnonzero((out != np.floor(out)) & (np.abs(out) < _FLOAT32_INTEGERS))
    for places in range(1, _MAX_PLACES + 1):
        if not todo.size:
            return out
        scale = 10.0**places
        decimal = np.rint(out[todo] * scale) / scale
        same = decimal.astype(np.float32) == sent[todo]
        out[todo[same]] = decimal[same]
        todo = todo[~same]
    if todo.size:
        out[todo] = sent[todo].astype(np.float32).astype(str).astype(np.float64)
    return out


def _unpacked(row: Sequence[Any], dtypes: Sequence[str]) -> PackedChunk:
    nulls = np.frombuffer(row[5], ">i4")
    values, raw = [], []
    for j, dtype in enumerate(dtypes):
        sent = np.frombuffer(row[6 + j], dtype)
        if dtype == ">f4":  # a real is read as its printed decimal, nothing else
            sent = as_printed(sent.astype(np.float32))
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
