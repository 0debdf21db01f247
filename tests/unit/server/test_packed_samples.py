"""On PostgreSQL the judge reads new samples packed (server.judge.packed_samples): the windows it
builds are the ones the row reader builds from the same rows, value for value, pass after pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge import judging
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.judge.packed_samples import as_printed, packed_samples, reads_packed

START = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
BIG = 2**60 + 7  # a counter float64 cannot hold exactly


def _values(index: int, k: int) -> dict[str, Any]:
    """Readings that take every path of the packed read: reals that are not float32-exact,
    unreported fields (NULL), flags, small integers and a counter past 2**53."""
    values: dict[str, Any] = {"gpu_temp_c": 55.3 + k % 3, "pcie_link_gen": 5}
    if index == 0:
        values["ecc_sbe_volatile_total"] = BIG + k
        values["remapped_rows_pending"] = k % 2 == 0
    if index == 1:
        values.update(gpu_temp_c=None, ecc_sbe_volatile_total=None, gpu_recovery_action=k % 2)
    return values


def _push(push: Push, node: str, first: int, ticks: int, boot: str) -> None:
    at = START + timedelta(seconds=10 * first)
    batch = make_batch(node, gpus=3, start=at, boot_id=boot)
    batch["samples"] = [
        make_sample(gpu_uuid(node, i), at + timedelta(seconds=10 * k), **_values(i, first + k))
        for k in range(ticks)
        for i in range(3)
    ]
    assert push(batch).status_code == 200


def _judge() -> FleetJudge:
    return FleetJudge(catalog=XidCatalog.load(), thresholds=HealthThresholds())


def _state(judge: FleetJudge) -> dict[str, Any]:
    w = judge.windows
    w.merge()
    series = {
        gpu.uuid: [(s.boot_id, s.sample.ts, *(getattr(s.sample, f) for f in w.fields))
                   for s in w.series(int(np.searchsorted(w.slots, gpu.slot)), gpu.uuid)]
        for gpu in judge._gpus.values()
    }  # fmt: skip
    return {
        "slot": w.slot.tolist(),
        "ts": w.ts.tolist(),
        "boots": [w._boots[code] for code in w.boot.tolist()],
        # NaN as None: NaN != NaN, and a list holding it would never compare equal.
        "values": [(c.dtype.str, [None if v != v else v for v in c.tolist()]) for c in w._values],
        "exact": w._exact,
        "last_id": judge._last_id,
        "series": series,
    }


def _load(judge: FleetJudge, db: Database, now: datetime) -> None:
    with db.read() as conn:
        judge._load_gpus(conn)
        judge._load_samples(conn, now)


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_packed_read_builds_the_windows_the_row_read_builds(
    push: Push, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.read() as conn:
        assert reads_packed(conn)
    packed, rows = _judge(), _judge()

    def passes(now: datetime) -> None:
        _load(packed, db, now)
        with monkeypatch.context() as patched:
            patched.setattr(judging, "reads_packed", lambda conn: False)
            _load(rows, db, now)

    _push(push, "node-a", 0, 30, "boot-1")
    _push(push, "node-b", 0, 30, "boot-1")
    passes(START + timedelta(minutes=4))  # the first pass: by time, the later samples not yet
    assert _state(packed) == _state(rows)
    _push(push, "node-a", 30, 20, "boot-2")  # rebooted
    _push(push, "node-c", 30, 20, "boot-1")  # GPUs new since the first pass
    passes(START + timedelta(minutes=8))  # by id from here on
    assert _state(packed) == _state(rows)
    assert gpu_uuid("node-c", 2) in _state(packed)["series"]
    state = _state(packed)
    assert set(state["boots"]) == {"boot-1", "boot-2"}
    assert state["exact"] and all(type(v) is int for v in state["exact"].values())
    assert 55.3 in state["series"][gpu_uuid("node-a", 0)][0]  # the decimal, not the float32
    passes(START + timedelta(minutes=9))  # nothing new
    assert _state(packed) == _state(rows)


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_packed_read_comes_in_time_ordered_chunks(push: Push, db: Database) -> None:
    _push(push, "node-a", 0, 10, "boot-1")
    with db.read() as conn:
        chunks = list(
            packed_samples(conn, ["gpu_temp_c"], until=START + timedelta(hours=1), after_id=0,
                           chunk=7)
        )  # fmt: skip
    assert [c.ids.size for c in chunks] == [7, 7, 7, 7, 2]
    ts = np.concatenate([c.ts_us for c in chunks])
    assert (np.diff(ts) >= 0).all()
    first = START.timestamp() * 1_000_000
    assert ts[0] == first
    with pytest.raises(ValueError, match="exactly one"):
        next(packed_samples(conn, ["gpu_temp_c"], until=START))


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_packed_read_sorts_in_memory_for_its_transaction_only(push: Push, db: Database) -> None:
    """The read raises PostgreSQL's memory per sort for its own transaction (its two sorts of a
    30 s pass fit in memory instead of spilling to disk); the session keeps its own setting."""
    _push(push, "node-a", 0, 3, "boot-1")
    with db.read() as conn:
        before = conn.execute(text("SHOW work_mem")).scalar()
        list(packed_samples(conn, ["gpu_temp_c"], until=START + timedelta(hours=1), after_id=0))
        assert conn.execute(text("SHOW work_mem")).scalar() == "128MB"
    with db.read() as conn:
        assert conn.execute(text("SHOW work_mem")).scalar() == before != "128MB"


def _wire_reals(rng: np.random.Generator) -> np.ndarray:
    """Reals the wire can store (every real field is bounded by 50,000 in magnitude): whole
    numbers, milliwatts, tenths, quarters, tiny fractions, and float32 bit patterns drawn at
    random within the bound (which take every number of decimal places, and the fallback)."""
    bits = rng.integers(0, 2**31, 400_000).astype(np.uint32).view(np.float32)
    drawn = bits[np.isfinite(bits) & (np.abs(bits) <= 50_000)]
    return np.concatenate(
        [
            rng.integers(-50, 50_000, 50_000),
            rng.integers(0, 10_000_000, 100_000) / 1000,
            rng.integers(-500, 2_000, 20_000) / 10,
            np.arange(-50, 200, 0.25),
            rng.random(20_000) * 1e-3,
            rng.random(5_000) * 1e-9,
            [0.0, -0.0, 55.3, 700.123, 49_999.996, 16_777_215.0, 1e-45],
            drawn,
            -drawn[:50_000],
        ]
    ).astype(np.float32)


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_reals_read_packed_equal_what_postgresql_prints_for_them(db: Database) -> None:
    """as_printed on the four bytes of a real gives the float64 of the decimal PostgreSQL prints
    for it (real::text::float8, what the row reader's text loader reads), for every value the
    wire can store; the array's own float64 would differ on most of them."""
    sent = _wire_reals(np.random.default_rng(12))
    with db.write() as conn:
        raw = conn.connection.driver_connection
        raw.execute("CREATE TEMP TABLE reals (i int, v real) ON COMMIT DROP")
        with raw.cursor().copy("COPY reals (i, v) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "float4"])
            for i, value in enumerate(sent.tolist()):
                copy.write_row((i, value))
        printed, stored = raw.execute(
            "SELECT string_agg(float8send(v::text::float8), ''::bytea ORDER BY i), "
            "string_agg(float4send(v), ''::bytea ORDER BY i) FROM reals"
        ).fetchone()
    expected = np.frombuffer(printed, ">f8")
    read = as_printed(np.frombuffer(stored, ">f4").astype(np.float32))
    assert read.size == sent.size > 400_000
    differ = np.flatnonzero(read != expected)
    assert differ.size == 0, [
        (float(sent[i]), float(expected[i]), float(read[i])) for i in differ[:5]
    ]
    assert np.array_equal(np.signbit(read), np.signbit(expected))
    assert (sent.astype(np.float64) != expected).mean() > 0.5, "the test data is mostly inexact"


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_packed_read_after_an_id_goes_range_by_range_across_gaps(push: Push, db: Database) -> None:
    """After an id, the read goes ``chunk`` ids at a time: every stored row once, each chunk in
    time order even where ids are not, a gap wider than a range (a dropped day) skipped, and
    nothing newer than ``until``."""
    _push(push, "node-a", 0, 10, "boot-1")  # ids 1..30: 10 ticks x 3 GPUs
    with db.write() as conn:
        conn.execute(text("DELETE FROM gpu_samples WHERE id BETWEEN 8 AND 21"))
        # ids 1..5 stored in reverse time order (a late spool beside new readings)
        conn.execute(
            text("UPDATE gpu_samples SET ts = :start + (10 - id) * interval '1 ms' WHERE id <= 5"),
            {"start": START},
        )
        stored = conn.execute(text("SELECT id, ts FROM gpu_samples ORDER BY id")).all()

    def read(**kwargs: Any) -> list[Any]:
        with db.read() as conn:
            return list(packed_samples(conn, ["gpu_temp_c"], after_id=0, chunk=5, **kwargs))

    chunks = read(until=START + timedelta(hours=1))
    ids = np.concatenate([c.ids for c in chunks])
    assert sorted(ids.tolist()) == [row.id for row in stored] and ids.size == len(set(ids))
    assert all(c.ids.size <= 5 and (np.diff(c.ts_us) >= 0).all() for c in chunks)
    assert chunks[0].ids.tolist() == [5, 4, 3, 2, 1]
    until = START + timedelta(seconds=75)
    early = np.concatenate([c.ids for c in read(until=until)]).tolist()
    assert sorted(early) == [row.id for row in stored if row.ts <= until] != ids.tolist()
