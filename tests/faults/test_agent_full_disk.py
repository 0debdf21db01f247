"""The agent's spool on a full disk: the oldest routine batches give way, counted and reported.

A small tmpfs is mounted as the spool directory (root only; CI runs as root). A real agent
(``sim`` collector, a collection every 20 ms) spools into it while its server is unreachable,
until the disk is full and batches have been dropped; then the server (PostgreSQL) starts and the
agent, restarted on the same full disk, delivers everything it kept plus ``spool_dropped`` events
whose counts add up to what it dropped.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from fleetwatch.agent.spool import Spool
from tests.faults.waiting import wait_for as _wait_for
from tests.integration.live import (
    AgentProcess,
    create_token,
    fleetwatch,
    free_port,
    live_server,
    start_agent,
)

DISK = "2m"  # the spool keeps 1 MiB of it free for SQLite's log, so deletes still commit
NODE = "sim-node-000"
MIN_DROPS = 40


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``<tmp>/agents/<node>/spool``, where ``start_agent`` puts the spool."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "agents" / NODE / "spool"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def test_spool_deletes_and_keeps_spooling_on_a_full_tmpfs(small_disk: Path) -> None:
    """SQLite itself on a full disk: even after another program takes the last free byte, the
    spool still drops its oldest batch and stores the new one (its file is capped below the
    disk's free space, and the deletes' log frames fit in the reserve)."""
    spool = Spool(small_disk)
    puts = 0
    while spool.counter("dropped_batches") < 20:
        assert spool.put(f"b{puts}", os.urandom(1500), samples=8, events=0)
        puts += 1
    assert (small_disk / "spool.reserve").exists()  # the emergency room is kept
    # An empty log when the disk fills: the next write must grow it, as a delete then must too
    # (how much of a log the disk would still take depends on the file's layout, not on this).
    spool._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    filler = small_disk / "filler"
    with filler.open("wb", buffering=0) as sink:
        try:
            while True:
                sink.write(b"\0" * 4096)
        except OSError:
            pass  # ENOSPC: the disk is full to the last block
    stat = os.statvfs(small_disk)
    assert stat.f_bavail * stat.f_frsize < 4096
    dropped_before = spool.counter("dropped_batches")
    for i in range(50):
        assert spool.put(f"full{i}", os.urandom(1500), samples=8, events=0)
    kept, _ = spool.depth()
    newest = spool.next(kept - 1)
    assert newest is not None and newest.batch_id == "full49"
    assert spool.counter("dropped_batches") - dropped_before >= 45
    assert not (small_disk / "spool.reserve").exists()  # given back to let the deletes commit
    while (batch := spool.next()) is not None:
        spool.ack(batch.seq)
    print(
        f"full tmpfs ({DISK}): {puts + 50} batches of 1.5 KB spooled, "
        f"{spool.counter('dropped_batches')} oldest dropped, the last 50 on a disk with "
        f"{stat.f_bavail * stat.f_frsize} bytes free; {kept} kept and acknowledged"
    )
    spool.close()


def _agent(url: str, token: str, tmp_path: Path, spec: Path, interval_s: float) -> AgentProcess:
    return start_agent(
        NODE,
        url,
        token,
        tmp_path / "agents",
        "--collectors",
        "sim",
        "--sim-spec",
        str(spec),
        interval_s=interval_s,
    )


def _spool_state(spool_db: Path) -> tuple[list[int], list[str], int, dict[str, int], int]:
    """(kept seqs, kept batch ids, last seq ever given, counters, drop counts carried)."""
    db = sqlite3.connect(spool_db)
    try:
        rows = db.execute("SELECT seq, batch_id FROM batches ORDER BY seq").fetchall()
        (last,) = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'batches'").fetchone()
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
        (carried,) = db.execute("SELECT COALESCE(SUM(carried_batches), 0) FROM batches").fetchone()
        bodies = [json.loads(gzip.decompress(b)) for (b,) in db.execute("SELECT body FROM batches")]
    finally:
        db.close()
    assert all(body["node"]["name"] == NODE for body in bodies)
    return [r[0] for r in rows], [r[1] for r in rows], int(last), counters, int(carried)


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_agent_on_a_full_disk_drops_the_oldest_and_reports_it(
    database_url: str, tmp_path: Path, small_disk: Path
) -> None:
    fleetwatch("sim", "init", "--nodes", "1", "--gpus", "8", "--out", str(tmp_path / "sim"))
    spec = tmp_path / "sim" / "fleet.json"
    agent_token, read_token = (
        create_token(database_url, "agent"),
        create_token(database_url, "read"),
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"  # nothing listens yet: the server is down

    started = time.monotonic()
    agent = _agent(url, agent_token, tmp_path, spec, interval_s=0.02)  # fills the disk fast
    try:
        _wait_for(
            f"{MIN_DROPS} batches dropped on the full disk",
            lambda: (
                (agent.metric("fleetwatch_agent_spool_dropped_batches_total") or 0) >= MIN_DROPS
            ),
            timeout=180,
        )
        exported = agent.metric("fleetwatch_agent_spool_dropped_batches_total")
    finally:
        log = agent.stop()
    assert "collection cycle failed" not in log, log[-3000:]

    seqs, kept_ids, last, counters, carried = _spool_state(small_disk / "spool.db")
    dropped = counters["dropped_batches"]
    # The newest collections are kept (the last one spooled included), the oldest dropped, and
    # every drop is counted: nothing vanished uncounted, nothing was dropped out of order.
    assert seqs == list(range(last - len(seqs) + 1, last + 1))
    assert dropped == last - len(seqs)
    assert exported is not None and MIN_DROPS <= exported <= dropped
    assert carried + counters.get("unreported_batches", 0) == dropped
    print(
        f"server down, {DISK} tmpfs full: {last} collections spooled, {len(seqs)} newest kept, "
        f"{dropped} oldest dropped and counted ({exported:.0f} seen on /metrics before the stop)"
        f" in {time.monotonic() - started:.0f} s"
    )

    with live_server(database_url, tmp_path, port=port) as server:
        agent = _agent(url, agent_token, tmp_path, spec, interval_s=0.5)
        engine = create_engine(database_url)
        try:
            wanted = set(kept_ids)

            def delivered() -> bool:
                with engine.connect() as conn:
                    stored = {
                        r[0]
                        for r in conn.execute(
                            text("SELECT batch_id FROM ingest_batches WHERE batch_id = ANY(:ids)"),
                            {"ids": list(wanted)},
                        )
                    }
                return stored == wanted

            _wait_for("every kept batch stored", delivered, timeout=120)
        finally:
            engine.dispose()
            log = agent.stop()
        _, _, _, counters, _ = _spool_state(small_disk / "spool.db")
        dropped = counters["dropped_batches"]  # the restart may have dropped a few more
        with server.client(read_token) as read:

            def reported() -> list[dict[str, int]]:
                events = read.get(
                    "/v1/events", params={"kind": "spool_dropped", "node": NODE, "limit": 100000}
                ).json()["data"]
                return [e["details"] for e in events]

            _wait_for(
                "spool_dropped events adding up to every drop",
                lambda: sum(d["batches"] for d in reported()) == dropped,
                timeout=30,
            )
            details = reported()
            node = read.get(f"/v1/nodes/{NODE}").json()
    assert "collection cycle failed" not in log, log[-3000:]
    assert sum(d["samples"] for d in details) == counters["dropped_samples"]
    assert node["name"] == NODE and node["gpu_count"] == 8
    print(
        f"server up: all {len(kept_ids)} kept batches stored; {len(details)} spool_dropped "
        f"events report {sum(d['batches'] for d in details)} batches "
        f"({sum(d['samples'] for d in details)} samples) = {dropped} dropped"
    )
