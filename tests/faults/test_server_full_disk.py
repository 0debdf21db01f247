"""The database's disk fills up: 507, not ready, nothing acknowledged lost; SQLite and PostgreSQL.

A real `fleetwatch server` keeps its database on a small tmpfs: the SQLite file, or the data
directory of a throwaway PostgreSQL cluster (its WAL on another disk, as production puts it, so
that PostgreSQL refuses the write with SQLSTATE 53100 instead of stopping). A filler file takes
almost all of the free space, batches are posted until the server refuses one with 507 (never
500), /readyz says not ready while it does, and after the filler is deleted the refused batches
are taken and every batch that was ever answered 200 can be read back through the API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.factories import make_batch
from tests.integration.live import create_token, fleetwatch, free_port, live_server

NODE = "full-disk-node"
MAX_BATCHES = 400
DISK = "16m"
PG_DISK = "64m"  # initdb's data directory takes about 23 MiB
LEAVE_FREE = 1024 * 1024  # what the filler leaves: some dozens of batches


def _mount_tmpfs(mount: Path, size: str) -> None:
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    _mount_tmpfs(mount, DISK)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def postgres_on_small_disk() -> Iterator[tuple[str, Path]]:
    """(URL, the tmpfs holding its data directory) of a throwaway PostgreSQL cluster."""
    bin_dir = Path("/usr/lib/postgresql/15/bin")
    if not (bin_dir / "initdb").exists() or os.geteuid() != 0:
        pytest.skip("needs root and PostgreSQL 15's binaries in /usr/lib/postgresql/15/bin")
    base = Path(tempfile.mkdtemp(prefix="fw-pg-full-"))
    base.chmod(0o755)  # the postgres user walks through it
    mount, wal, sock = base / "disk", base / "wal", base / "sock"
    for made in (mount, wal, sock):
        made.mkdir()
    data = mount / "data"
    port = free_port()

    def as_postgres(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, cwd=base, timeout=120)  # fmt: skip

    try:
        _mount_tmpfs(mount, PG_DISK)
        data.mkdir()
        for owned in (data, wal, sock):
            shutil.chown(owned, "postgres")
        as_postgres(str(bin_dir / "initdb"), "-D", str(data), "--waldir", str(wal),
                    "-U", "postgres", "--auth", "trust", "-E", "UTF8", "--no-sync")  # fmt: skip
        options = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
                    "-l", str(sock / "pg.log"), "-w", "start")  # fmt: skip
        as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "fleetwatch")
        yield f"postgresql://postgres@127.0.0.1:{port}/fleetwatch", mount
    finally:
        stop = [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]
        subprocess.run(["runuser", "-u", "postgres", "--", *stop], capture_output=True, cwd=base)
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _batch(number: int) -> dict[str, object]:
    event = {"kind": "agent_start", "ts": _now(), "message": f"batch-{number}"}
    return make_batch(NODE, gpus=8, ticks=6, events=[event], batch_id=str(uuid.uuid4()))


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat()


def _fill(mount: Path) -> Path:
    """A file taking all but ``LEAVE_FREE`` bytes of the tmpfs."""
    filler = mount / "filler"
    stat = os.statvfs(mount)
    size = stat.f_bavail * stat.f_frsize - LEAVE_FREE
    with filler.open("wb") as out:
        chunk = b"\0" * (1024 * 1024)
        while size > 0:
            size -= out.write(chunk[: min(len(chunk), size)])
    return filler


def _stored_messages(client: httpx.Client) -> Counter[str]:
    response = client.get("/v1/events", params={"node": NODE, "limit": 100_000})
    assert response.status_code == 200, response.text
    return Counter(e["message"] for e in response.json()["data"] if e["kind"] == "agent_start")


@pytest.mark.slow
def test_full_sqlite_disk_answers_507_and_loses_nothing_acknowledged(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{small_disk / 'fleetwatch.db'}"
    _fill_until_507_then_recover(url, small_disk, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.postgres
def test_full_postgresql_disk_answers_507_and_loses_nothing_acknowledged(
    postgres_on_small_disk: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, disk = postgres_on_small_disk
    _fill_until_507_then_recover(url, disk, tmp_path, monkeypatch)


def _fill_until_507_then_recover(
    url: str, disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleetwatch("db", "upgrade", "--database-url", url)
    agent_token, read_token = create_token(url, "agent"), create_token(url, "read")
    # The failure-driven readiness is under test; a hold short enough to see it end.
    monkeypatch.setenv("FLEETWATCH_SERVER_STORAGE_MIN_FREE_BYTES", "0")
    monkeypatch.setenv("FLEETWATCH_SERVER_STORAGE_FULL_HOLD_S", "3")
    with (
        live_server(url, tmp_path) as server,
        server.client(agent_token) as agent,
        server.client(read_token) as reader,
    ):
        assert agent.post("/v1/ingest", json=_batch(-1)).status_code == 200  # warm: WAL exists
        filler = _fill(disk)
        answers: Counter[int] = Counter()
        accepted: list[str] = []
        refused: list[dict[str, object]] = []
        not_ready = None
        for number in range(MAX_BATCHES):
            batch = _batch(number)
            response = agent.post("/v1/ingest", json=batch)
            answers[response.status_code] += 1
            if response.status_code == 200:
                accepted.append(f"batch-{number}")
            elif response.status_code == 507:
                refused.append(batch)
                if not_ready is None:
                    print("first 507:", response.json()["error"])
                    not_ready = httpx.get(f"{server.url}/readyz", timeout=10)
                    print("readyz while full:", not_ready.status_code, not_ready.json())
                if len(refused) >= 5:
                    break
        print(f"answers while filling: {dict(answers)}; accepted {len(accepted)}")
        assert refused, f"the disk never filled in {MAX_BATCHES} batches: {dict(answers)}"
        assert set(answers) <= {200, 507}, f"only 200 and 507 are honest answers: {answers}"
        assert not_ready is not None and not_ready.status_code == 503
        assert "storage full" in not_ready.json()["reason"]
        metrics = reader.get("/metrics").text
        assert "fleetwatch_storage_full_errors_total" in metrics

        filler.unlink()  # an operator frees space
        retried = [agent.post("/v1/ingest", json=batch).status_code for batch in refused]
        print("refused batches re-sent after freeing space:", retried)
        assert retried == [200] * len(refused)
        server.wait_ready(timeout=60)  # /readyz recovers
        assert agent.post("/v1/ingest", json=_batch(MAX_BATCHES)).status_code == 200

        stored = _stored_messages(reader)
        lost = [m for m in accepted if stored[m] != 1]
        print(f"acknowledged while filling: {len(accepted)}, lost or duplicated: {len(lost)}")
        assert not lost
        refused_messages = [str(b["events"][0]["message"]) for b in refused]  # type: ignore[index]
        assert all(stored[m] == 1 for m in refused_messages)  # stored once, when re-sent
        assert server.process.poll() is None  # the server lived through it
