"""The real server process (uvicorn) over loopback HTTP, on SQLite and on real PostgreSQL."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import make_batch
from tests.integration.live import create_token, fleetwatch, free_port, live_server


@pytest.fixture
def server_db(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        fleetwatch("db", "upgrade", "--database-url", database_url)
    return database_url


def test_server_process_ingests_and_serves_reads_and_metrics(
    server_db: str, tmp_path: Path
) -> None:
    agent, reader = create_token(server_db, "agent"), create_token(server_db, "read")
    with live_server(server_db, tmp_path) as server:
        batch = make_batch("node-live", gpus=8, ticks=3)
        body = gzip.compress(json.dumps(batch).encode())
        with server.client(agent) as push:
            answer = push.post(
                "/v1/ingest",
                content=body,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"accepted": {"samples": 24, "events": 0}, "duplicate": False}
        with server.client(reader) as read:
            node = read.get("/v1/nodes/node-live").json()
            assert node["state"] == "up" and node["gpu_count"] == 8
            uuid = batch["gpus"][3]["uuid"]
            samples = read.get(f"/v1/gpus/{uuid}/samples", params={"fields": "gpu_temp_c"}).json()
            assert [p["values"] for p in samples["data"]] == [{"gpu_temp_c": 41.0}] * 3
            metrics = read.get("/metrics", params={"shard": 0, "shards": 1}).text
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        temps = list(families["fleetwatch_gpu_temperature_celsius"].samples)
        assert len(temps) == 8 and {s.labels["node"] for s in temps} == {"node-live"}


def test_server_process_concurrent_replays_store_once(server_db: str, tmp_path: Path) -> None:
    agent, reader = create_token(server_db, "agent"), create_token(server_db, "read")
    batch = make_batch("node-race", gpus=8, ticks=2)
    with live_server(server_db, tmp_path) as server, server.client(agent) as push:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: push.post("/v1/ingest", json=batch), range(8)))
        assert [a.status_code for a in answers] == [200] * 8
        duplicates = sorted(a.json()["duplicate"] for a in answers)
        assert duplicates == [False] + [True] * 7
        with server.client(reader) as read:
            uuid = batch["gpus"][0]["uuid"]
            assert read.get(f"/v1/gpus/{uuid}/samples").json()["count"] == 2


def test_server_process_reports_unreachable_once_three_intervals_pass(
    server_db: str, tmp_path: Path
) -> None:
    """Every answer agrees with the server's clock: an answer that was complete before the
    node's deadline (last_seen + 3 intervals) says up, one asked after it says unreachable.
    Wall-clock stamps taken around each request bound the server's ``now``, so this holds
    however slowly the machine runs, and no elapsed time is asserted."""
    agent, reader = create_token(server_db, "agent"), create_token(server_db, "read")
    interval = 1.0
    with live_server(server_db, tmp_path) as server:
        with server.client(agent) as push:
            assert push.post(
                "/v1/ingest", json=make_batch("node-quiet", interval_s=interval)
            ).is_success
        with server.client(reader) as read:
            last_seen = datetime.fromisoformat(read.get("/v1/nodes/node-quiet").json()["last_seen"])
            deadline = last_seen + timedelta(seconds=3 * interval)
            seen: list[tuple[datetime, datetime, str, bool]] = []  # asked, answered, state, up

            def both_say_unreachable() -> bool:
                asked = datetime.now(UTC)
                state = read.get("/v1/nodes/node-quiet").json()["state"]
                up = 'fleetwatch_node_up{node="node-quiet"} 1' in read.get("/metrics").text
                seen.append((asked, datetime.now(UTC), state, up))
                return state == "unreachable" and not up

            _until(both_say_unreachable)
    margin = timedelta(milliseconds=50)  # stamps are rounded to microseconds on the way
    for asked, answered, state, up in seen:
        if answered < deadline - margin:
            assert (state, up) == ("up", True), (asked, deadline)
        if asked > deadline + margin:
            assert (state, up) == ("unreachable", False), (asked, deadline)


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_server_process_keeps_data_across_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    agent, reader = create_token(url, "agent"), create_token(url, "read")
    batch = make_batch("node-persist", gpus=2)
    with live_server(url, tmp_path) as server, server.client(agent) as push:
        assert push.post("/v1/ingest", json=batch).json()["duplicate"] is False
    with live_server(url, tmp_path) as server:
        with server.client(agent) as push:
            assert push.post("/v1/ingest", json=batch).json()["duplicate"] is True
        with server.client(reader) as read:
            assert read.get("/v1/nodes").json()["count"] == 1


@pytest.mark.postgres
def test_server_refuses_unmigrated_postgres(postgres_url: str, tmp_path: Path) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(postgres_url)
    name = f"{base.database}_bare"
    dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        bare = base.set(database=name).render_as_string(hide_password=False)
        import subprocess
        import sys

        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetwatch",
                "server",
                "--port",
                str(free_port()),
                "--database-url",
                bare,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0
        assert "fleetwatch db upgrade" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_server_process_answers_413_for_oversized_body(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'big.db'}"
    agent = create_token(url, "agent")
    with live_server(url, tmp_path) as server, server.client(agent) as push:
        answer = push.post(
            "/v1/ingest",
            content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code == 413
    assert "8388608" in answer.json()["error"]


def test_server_processes_one_after_another_cut_the_same_shards(
    server_db: str, tmp_path: Path
) -> None:
    """Two server processes (each with its own salt for Python's hash()) and a restart: every
    node is in the same shard of 4, and in exactly one."""
    agent, reader = create_token(server_db, "agent"), create_token(server_db, "read")
    names = [f"node-shard-{i:02d}" for i in range(24)]

    def gpu_nodes(text: str) -> set[str]:
        return {
            sample.labels["node"]
            for family in text_string_to_metric_families(text)
            if family.name == "fleetwatch_gpu_info"
            for sample in family.samples
        }

    seen: list[list[set[str]]] = []
    for run in range(2):
        with live_server(server_db, tmp_path) as server:
            if run == 0:
                with server.client(agent) as push:
                    for name in names:
                        answer = push.post("/v1/ingest", json=make_batch(name, gpus=1))
                        assert answer.status_code == 200, answer.text
            with server.client(reader) as read:
                pages = [read.get("/metrics", params={"shard": i, "shards": 4}) for i in range(4)]
        assert all(page.status_code == 200 for page in pages)
        seen.append([gpu_nodes(page.text) for page in pages])
    assert seen[0] == seen[1]
    assert sorted(name for shard in seen[0] for name in shard) == names
    assert all(shard for shard in seen[0])  # 24 nodes: no shard of 4 is empty


def test_server_process_access_log_leaves_out_accepted_pushes_by_default(tmp_path: Path) -> None:
    """uvicorn's access log of the real server process: an accepted push has no line; a refused
    push and other requests have theirs (log_accepted_pushes brings the accepted ones back:
    tests/unit/server/test_access_log.py)."""
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    fleetwatch("db", "upgrade", "--database-url", url)
    agent, reader = create_token(url, "agent"), create_token(url, "read")
    with live_server(url, tmp_path) as server:
        with server.client(agent) as push:
            assert push.post("/v1/ingest", json=make_batch("node-log")).status_code == 200
        with server.client("not-a-token") as stranger:
            assert stranger.post("/v1/ingest", json=make_batch("node-log")).status_code == 401
        with server.client(reader) as read:
            assert read.get("/v1/nodes/node-log").status_code == 200
    log = server.log.read_text()
    assert '"POST /v1/ingest HTTP/1.1" 200' not in log
    assert '"POST /v1/ingest HTTP/1.1" 401' in log
    assert '"GET /v1/nodes/node-log HTTP/1.1" 200' in log
