"""Reading the stored sample blocks (server.repo.sample_reader): the judge's windows hold the
samples as they were sent, value for value, pass after pass; reads keep to the bounds asked for,
go range by range after a block id, and find the newest samples of a GPU however its blocks
overlap. Both databases, real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select, text
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.rules.health_screen import JUDGED_FIELDS
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.real_values import as_printed
from fleetwatch.server.db.sample_columns import python_type
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_sample_blocks, gpus
from fleetwatch.server.ingest.sample_writer import write_sample_rows
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.judge.windows import SampleWindows
from fleetwatch.server.repo.sample_reader import newest_samples, read_samples, sample_rows, to_us

START = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
BIG = 2**60 + 7  # a counter float64 cannot hold exactly


def _values(index: int, k: int) -> dict[str, Any]:
    """Readings that take every path of the codec: reals that are not float32-exact, unreported
    fields, flags, small integers and a counter past 2**53."""
    values: dict[str, Any] = {"gpu_temp_c": 55.3 + k % 3, "pcie_link_gen": 5}
    if index == 0:
        values["ecc_sbe_volatile_total"] = BIG + k
        values["remapped_rows_pending"] = k % 2 == 0
    if index == 1:
        values.update(gpu_temp_c=None, ecc_sbe_volatile_total=None, gpu_recovery_action=k % 2)
    return values


def _batch(node: str, first: int, ticks: int, boot: str) -> dict[str, Any]:
    at = START + timedelta(seconds=10 * first)
    batch = make_batch(node, gpus=3, start=at, boot_id=boot)
    batch["samples"] = [
        make_sample(gpu_uuid(node, i), at + timedelta(seconds=10 * k), **_values(i, first + k))
        for k in range(ticks)
        for i in range(3)
    ]
    return batch


def _judge() -> FleetJudge:
    return FleetJudge(catalog=XidCatalog.load(), thresholds=HealthThresholds())


def _load(judge: FleetJudge, db: Database, now: datetime) -> None:
    """A routine pass's reads: the GPUs, then the samples stored since the last pass."""
    with db.read() as conn:
        judge._load_gpus(conn)
        judge._load_samples(conn, now)


def _sent_windows(judge: FleetJudge, sent: list[dict[str, Any]]) -> SampleWindows:
    """The windows ``judge``'s would be, built from the samples as sent (Python values, read by
    the row API of the windows), its GPUs in its slots."""
    windows = SampleWindows(JUDGED_FIELDS, [python_type(f) for f in JUDGED_FIELDS])
    for batch in sent:
        samples = batch["samples"]
        windows.add(
            [judge._gpus[s["uuid"]].slot for s in samples],
            [datetime.fromisoformat(s["ts"]) for s in samples],
            [batch["node"]["boot_id"]] * len(samples),
            [[s.get(f) for s in samples] for f in JUDGED_FIELDS],
        )
    windows.compact(judge.history // _US, judge.dense // _US, judge.sparse_step // _US)
    return windows


_US = timedelta(microseconds=1)


def _window_state(windows: SampleWindows) -> dict[str, Any]:
    windows.merge()
    return {
        "slot": windows.slot.tolist(),
        "ts": windows.ts.tolist(),
        "boots": [windows._boots[code] for code in windows.boot.tolist()],
        # NaN as None: NaN != NaN, and a list holding it would never compare equal.
        "values": [[None if v != v else v for v in c.tolist()] for c in windows._values],
        "exact": windows._exact,
    }


def test_the_judge_reads_back_the_samples_as_sent(push: Push, db: Database) -> None:
    """Pass after pass (the first by time, then by block id), the judge's windows hold what the
    agents sent: the same times, boots and values (a real as its decimal, a counter past 2**53
    exactly, unreported fields as such) as windows built from the sent samples themselves."""
    judge = _judge()
    sent: list[dict[str, Any]] = []

    def pushed(batch: dict[str, Any]) -> None:
        assert push(batch).status_code == 200
        sent.append(batch)

    pushed(_batch("node-a", 0, 30, "boot-1"))
    pushed(_batch("node-b", 0, 30, "boot-1"))
    now = START + timedelta(minutes=9)  # after the newest sample
    _load(judge, db, now)
    first_id = judge._last_id
    pushed(_batch("node-a", 30, 20, "boot-2"))  # rebooted
    pushed(_batch("node-c", 30, 20, "boot-1"))  # GPUs new since the first pass
    _load(judge, db, now)
    assert judge._last_id is not None and first_id is not None and judge._last_id > first_id
    state = _window_state(judge.windows)
    assert state == _window_state(_sent_windows(judge, sent))
    assert set(state["boots"]) == {"boot-1", "boot-2"}
    assert state["exact"] and all(type(v) is int for v in state["exact"].values())
    temps = state["values"][JUDGED_FIELDS.index("gpu_temp_c")]
    assert 55.3 in temps and None in temps  # the decimal, not the float32; unreported stays so
    _load(judge, db, now)  # nothing new
    assert _window_state(judge.windows) == state


def test_read_after_an_id_comes_in_time_ordered_chunks(push: Push, db: Database) -> None:
    assert push(_batch("node-a", 0, 10, "boot-1")).status_code == 200  # 3 blocks of 10 ticks
    assert push(_batch("node-a", 10, 10, "boot-1")).status_code == 200
    with db.read() as conn:
        chunks = list(read_samples(conn, ["gpu_temp_c"], after_id=0, chunk=2))
    assert [c.size for c in chunks] == [20, 20, 20]  # two blocks of 10 ticks a chunk
    assert all((np.diff(c.ts_us) >= 0).all() for c in chunks)
    ids = np.concatenate([c.ids for c in chunks])
    assert sorted(set(ids.tolist())) == list(range(int(ids.min()), int(ids.min()) + 6))
    assert int(np.concatenate([c.ts_us for c in chunks]).min()) == to_us(START)


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
def test_reals_read_back_equal_what_postgresql_prints_for_them(db: Database) -> None:
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


def test_read_after_an_id_goes_range_by_range_across_gaps(push: Push, db: Database) -> None:
    """After an id, the read goes ``chunk`` ids at a time: every stored block once, each chunk in
    time order even where ids are not, a gap wider than a range (a dropped day) skipped, and
    nothing newer than ``until``."""
    for k in range(10):  # blocks 3k+1 .. 3k+3: one per GPU per push
        assert push(_batch("node-a", k, 1, "boot-1")).status_code == 200
    with db.write() as conn:
        conn.execute(text("DELETE FROM gpu_sample_blocks WHERE id BETWEEN 8 AND 21"))
        # ids 1..5 stored in reverse time order (a late spool beside new readings)
        for i in range(1, 6):
            at = START + timedelta(milliseconds=10 - i)
            conn.execute(gpu_sample_blocks.update().where(gpu_sample_blocks.c.id == i), {"ts0": at})
        stored = conn.execute(text("SELECT id FROM gpu_sample_blocks ORDER BY id")).scalars().all()

    def read(**kwargs: Any) -> list[Any]:
        with db.read() as conn:
            return list(read_samples(conn, ["gpu_temp_c"], after_id=0, chunk=5, **kwargs))

    chunks = read(until=START + timedelta(hours=1))
    ids = np.concatenate([c.ids for c in chunks])
    assert sorted(ids.tolist()) == stored and ids.size == len(set(ids.tolist()))
    assert all(c.size <= 5 and (np.diff(c.ts_us) >= 0).all() for c in chunks)
    assert chunks[0].ids.tolist() == [5, 4, 3, 2, 1]
    until = START + timedelta(seconds=75)
    early = np.concatenate([c.ids for c in read(until=until)]).tolist()
    assert early and max(early) < max(stored) and sorted(early) != sorted(ids.tolist())


def _gpu_ids(db: Database) -> dict[str, int]:
    with db.read() as conn:
        return dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())


def test_reads_keep_to_their_bounds_across_block_edges(push: Push, db: Database) -> None:
    """Blocks begin before a bound and end after it: each read gives exactly the samples within
    its bounds, of the GPUs and nodes asked for."""
    for first in (0, 6, 12):
        assert push(_batch("node-a", first, 6, "boot-1")).status_code == 200
    assert push(_batch("node-b", 0, 18, "boot-1")).status_code == 200
    ids = _gpu_ids(db)
    a0, b2 = ids[gpu_uuid("node-a", 0)], ids[gpu_uuid("node-b", 2)]
    since, until = START + timedelta(seconds=35), START + timedelta(seconds=125)
    with db.read() as conn:

        def times(**kwargs: Any) -> list[tuple[int, int]]:
            chunks = read_samples(conn, ["gpu_temp_c"], **kwargs)
            return sorted(
                (g, t)
                for c in chunks
                for g, t in zip(c.gpu_ids.tolist(), c.ts_us.tolist(), strict=True)
            )

        every = times(after_id=0)
        assert len(every) == 3 * 18 * 2
        node_a = times(since=since, until=until, node_ids=[1])
        assert node_a == [
            (g, t) for g, t in every if g in {ids[gpu_uuid("node-a", i)] for i in range(3)}
            and to_us(since) <= t <= to_us(until)
        ]  # fmt: skip
        assert len(node_a) == 3 * 9
        before = times(gpu_ids=[a0, b2], before=until)
        assert before == [(g, t) for g, t in every if g in (a0, b2) and t < to_us(until)]
        assert len(before) == 2 * 13  # ticks 0 to 120 s


def test_newest_samples_are_the_newest_however_blocks_overlap(db: Database) -> None:
    """A GPU's newest samples come from every block that may hold them: here a late block (a
    spool emptying) begins before the newest block and ends after most of it."""
    with db.write() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (name, labels, interval_s, first_seen, last_seen) "
                "VALUES ('n', '{}', 10, :t, :t)"
            ),
            {"t": START},
        )
        conn.execute(
            text(
                'INSERT INTO gpus (uuid, node_id, "index", first_seen, last_seen) '
                "VALUES ('GPU-x', 1, 0, :t, :t)"
            ),
            {"t": START},
        )
        gpu_id = conn.execute(select(gpus.c.id)).scalar_one()

        def rows(seconds: range, temp: float) -> list[dict[str, Any]]:
            return [
                {"gpu_id": gpu_id, "node_id": 1, "ts": START + timedelta(seconds=s),
                 "gpu_temp_c": temp}
                for s in seconds
            ]  # fmt: skip

        write_sample_rows(conn, rows(range(0, 600, 10), 40.0))
        write_sample_rows(conn, rows(range(600, 1200, 10), 41.0))
        write_sample_rows(conn, rows(range(605, 1205, 100), 42.0))  # late, spanning the newest
    with db.read() as conn:
        newest = newest_samples(conn, ["gpu_temp_c"], gpu_id=gpu_id, limit=8)
        bounded = newest_samples(
            conn, ["gpu_temp_c"], gpu_id=gpu_id, limit=500, since=START + timedelta(seconds=590),
            before=START + timedelta(seconds=620),
        )  # fmt: skip
    assert newest is not None and bounded is not None
    every = sorted(
        [(s, 40.0) for s in range(0, 600, 10)]
        + [(s, 41.0) for s in range(600, 1200, 10)]
        + [(s, 42.0) for s in range(605, 1205, 100)]
    )
    got = [(int((r[0] - START).total_seconds()), r[4]) for r in sample_rows(newest)]
    assert got == every[-8:]
    got = [(int((r[0] - START).total_seconds()), r[4]) for r in sample_rows(bounded)]
    assert got == [(s, t) for s, t in every if 590 <= s < 620]
