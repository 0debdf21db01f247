"""Straggler detection: the window judge and detector on synthetic jobs, then end to end through
the API (steps in, verdicts, job detail, /metrics, telemetry evidence)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_gpu, make_sample

from fleetwatch.config import ServerSettings
from fleetwatch.models.stragglers import (
    DetectorConfig,
    JobDetector,
    StepRow,
    Transition,
    judge_window,
)
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import job_steps, jobs, node_slowness, straggler_state, stragglers
from fleetwatch.server.judge.straggler_detector import StragglerDetector

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)  # an old job, judged on its own clock
WINDOW = timedelta(seconds=10)

Factor = Callable[[str, int, float], float]  # (node, rank, seconds since start) -> slowdown


def make_steps(
    *, nodes: int = 8, ranks_per_node: int = 8, seconds: float = 60.0, period_s: float = 0.5,
    base_ms: float = 400.0, factor: Factor = lambda node, rank, t: 1.0,
    stages: int | None = None, seed: int = 0, start: datetime = START,
) -> list[StepRow]:  # fmt: skip
    """Every rank reports a step every ``period_s``; durations are log-normal (3 %) around base."""
    rng = np.random.default_rng(seed)
    ranks = nodes * ranks_per_node
    rows = []
    for i in range(int(seconds / period_s)):
        t = i * period_s
        noise = rng.lognormal(0.0, 0.03, size=ranks)
        for rank in range(ranks):
            node = f"n{rank // ranks_per_node:02d}"
            stage = rank * stages // ranks if stages else None
            duration = base_ms * factor(node, rank, t) * float(noise[rank])
            rows.append(StepRow(rank, node, duration, start + timedelta(seconds=t), stage))
    return rows


def run_detector(
    rows: list[StepRow], windows: int, config: DetectorConfig | None = None, **kwargs: object
) -> list[Transition]:
    detector = JobDetector(config or DetectorConfig(), **kwargs)  # type: ignore[arg-type]
    out = []
    for w in range(windows):
        start, end = START + WINDOW * w, START + WINDOW * (w + 1)
        window = [r for r in rows if start <= r.ts < end]
        out.extend(detector.feed(judge_window(window, start, end, ratio=1.25)))
    return out


def slow_node_after(node: str, onset_s: float, factor: float = 1.3) -> Factor:
    return lambda n, rank, t: factor if n == node and t >= onset_s else 1.0


def test_straggler_slow_node_is_hardware_after_three_windows_not_two() -> None:
    rows = make_steps(factor=slow_node_after("n03", 20.0), seconds=60.0)
    # Windows 0-1 normal, 2, 3, 4 slow: after window 3 (two slow windows) nothing yet.
    assert run_detector(rows, 4) == []
    opened = run_detector(rows, 5)
    assert [(t.action, t.node, t.kind) for t in opened] == [("open", "n03", "hardware")]
    verdict = opened[0]
    assert verdict.started_at == START + timedelta(seconds=20)
    assert verdict.ratio == pytest.approx(1.3, abs=0.03)
    assert verdict.evidence["baseline_ratio"] == pytest.approx(1.0, abs=0.03)
    assert verdict.evidence["p99_ms"] > verdict.evidence["p50_ms"]


def test_straggler_one_noisy_step_never_flags() -> None:
    def noisy(node: str, rank: int, t: float) -> float:
        return 25.0 if rank == 17 and int(t * 2) % 20 == 0 else 1.0  # one huge step a window

    rows = make_steps(factor=noisy, seconds=60.0)
    assert run_detector(rows, 6) == []
    window = [r for r in rows if r.ts < START + WINDOW]
    judged = judge_window(window, START, START + WINDOW, ratio=1.25)
    assert judged is not None
    noisiest = max(r.duration_ms for r in window if r.rank == 17)
    assert noisiest > 20 * judged.nodes["n02"].p50_ms  # the noise is there, and not flagged


def test_straggler_whole_slow_pipeline_stage_is_workload() -> None:
    # 4 stages of 16 ranks: stage 3 is nodes n06 and n07, slowed from 20 s on.
    def stage3(node: str, rank: int, t: float) -> float:
        return 1.4 if rank >= 48 and t >= 20.0 else 1.0

    transitions = run_detector(make_steps(factor=stage3, stages=4), 6)
    opened = [t for t in transitions if t.action == "open"]
    assert {t.node for t in opened} == {"n06", "n07"}
    assert {t.kind for t in opened} == {"workload"}
    assert all(t.evidence["stage_peer_ratio"] >= 1.25 for t in opened)


def test_straggler_slow_from_first_window_is_workload() -> None:
    opened = run_detector(make_steps(factor=slow_node_after("n05", 0.0)), 3)
    assert [(t.action, t.node, t.kind) for t in opened] == [("open", "n05", "workload")]
    assert "first windows" in opened[0].evidence["reason"]


def test_straggler_verdict_closes_after_three_normal_windows() -> None:
    # Slow over 20-60 s, normal again from 60 s: windows 6, 7, 8 normal.
    def spell(node: str, rank: int, t: float) -> float:
        return 1.35 if node == "n01" and 20.0 <= t < 60.0 else 1.0

    rows = make_steps(factor=spell, seconds=100.0)
    after_two = run_detector(rows, 8)
    assert [t.action for t in after_two if t.action != "update"] == ["open"]
    actions = [t.action for t in run_detector(rows, 9)]
    assert actions[0] == "open" and actions[-1] == "close"
    closing = run_detector(rows, 9)[-1]
    assert closing.at == START + timedelta(seconds=90)
    assert closing.windows == 4  # slow windows 2, 3, 4, 5


def test_straggler_robust_z_keeps_a_uniformly_noisy_fleet_quiet() -> None:
    # Node medians spread evenly from 1x to 2x: no node is a robust outlier at 1.25x.
    spread = {f"n{i:02d}": 1.0 + 0.15 * i for i in range(8)}
    rows = make_steps(factor=lambda n, r, t: spread[n])
    window = [r for r in rows if r.ts < START + WINDOW]
    judged = judge_window(window, START, START + WINDOW, ratio=1.25)
    assert judged is not None
    top = judged.nodes["n07"]
    assert top.ratio >= 1.25 and not top.slow  # ratio alone would flag it; z does not


# --- end to end through the API ---------------------------------------------------------------


def _post(client: TestClient, token: str, job: str, rows: list[StepRow]) -> None:
    for i in range(0, len(rows), 5000):
        body = {"steps": [
            {"rank": r.rank, "node": r.node, "step": k, "duration_ms": r.duration_ms,
             "ts": r.ts.isoformat(), **({"stage": r.stage} if r.stage is not None else {})}
            for k, r in enumerate(rows[i:i + 5000], start=i)
        ]}  # fmt: skip
        response = client.post(f"/v1/jobs/{job}/steps", json=body, headers=bearer(token))
        assert response.status_code == 200, response.text


def test_straggler_api_flags_hardware_on_the_jobs_own_clock(
    client: TestClient, tokens: dict[str, str]
) -> None:
    rows = make_steps(factor=slow_node_after("n03", 20.0), seconds=56.0)
    _post(client, tokens["agent"], "replay-1", rows)
    detector = client.app.state.stragglers  # type: ignore[attr-defined]
    assert detector.run_once() == 5  # windows 0-4 judged (the job's last step is at 55.5 s)
    read = bearer(tokens["read"])
    found = client.get("/v1/stragglers", params={"active": "true"}, headers=read).json()
    assert [(s["node"], s["kind"]) for s in found["data"]] == [("n03", "hardware")]
    assert found["data"][0]["started_at"].startswith("2024-03-01T12:00:20")
    assert (
        client.get("/v1/stragglers", params={"kind": "workload"}, headers=read).json()["count"] == 0
    )
    detail = client.get("/v1/jobs/replay-1", headers=read).json()
    assert detail["ranks"] == 64 and len(detail["nodes"]) == 8
    top = detail["node_stats"][0]
    assert top["node"] == "n03" and top["ratio"] == pytest.approx(1.3, abs=0.05)
    assert top["p99_over_p50"] >= 1.0
    assert [s["node"] for s in detail["stragglers"]] == ["n03"]
    jobs = client.get("/v1/jobs", headers=read).json()
    assert [j["job_id"] for j in jobs["data"]] == ["replay-1"]
    metrics = client.get("/metrics", headers=read).text
    series = 'fleetwatch_node_step_slowdown_ratio{node="n03",job="replay-1"} '
    value = float(metrics.split(series, 1)[1].split()[0])
    assert value == pytest.approx(1.3, abs=0.05)
    # Slowness scores are per-node detail, on the shard pages (the one shard of one: every node).
    detail = client.get("/metrics", params={"shard": 0, "shards": 1}, headers=read).text
    assert 'fleetwatch_node_slowness_score{node="n03"}' in detail
    assert "fleetwatch_node_slowness_score" not in metrics
    assert detector.run_once() == 0  # nothing new: nothing judged twice


def test_straggler_verdict_closes_through_the_api(
    client: TestClient, tokens: dict[str, str]
) -> None:
    def spell(node: str, rank: int, t: float) -> float:
        return 1.4 if node == "n02" and 20.0 <= t < 50.0 else 1.0

    rows = make_steps(factor=spell, seconds=96.0, nodes=4)
    detector = client.app.state.stragglers  # type: ignore[attr-defined]
    _post(client, tokens["agent"], "j2", [r for r in rows if r.ts < START + timedelta(seconds=56)])
    detector.run_once()
    read = bearer(tokens["read"])
    assert client.get("/v1/stragglers", params={"active": True}, headers=read).json()["count"] == 1
    _post(client, tokens["agent"], "j2", [r for r in rows if r.ts >= START + timedelta(seconds=56)])
    detector.run_once()
    assert client.get("/v1/stragglers", params={"active": True}, headers=read).json()["count"] == 0
    closed = client.get("/v1/stragglers", params={"active": False}, headers=read).json()["data"]
    assert closed[0]["ended_at"].startswith("2024-03-01T12:01:20")  # after windows 5, 6, 7
    assert closed[0]["windows"] == 3


def test_straggler_hardware_verdict_carries_throttle_evidence(
    client: TestClient, tokens: dict[str, str]
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=120)
    onset = start + timedelta(seconds=30)
    rows = make_steps(factor=slow_node_after("n03", 30.0), seconds=70.0, nodes=4, start=start)
    # Node n03's GPU: cool and fast before the onset, power-capped and slow after.
    samples = [
        make_sample(gpu_uuid("n03", 0), start + timedelta(seconds=s),
                    **({"clocks_event_reasons": 0x4, "sm_clock_mhz": 1500.0, "gpu_temp_c": 60.0}
                       if start + timedelta(seconds=s) >= onset else {}))
        for s in range(0, 70, 5)
    ]  # fmt: skip
    batch = {"batch_id": "b-1", "node": {"name": "n03", "labels": {}, "interval_s": 5.0,
             "agent_version": "t", "boot_id": "b"}, "gpus": [make_gpu("n03", 0)],
             "samples": samples, "events": []}  # fmt: skip
    response = client.post("/v1/ingest", json=batch, headers=bearer(tokens["agent"]))
    assert response.status_code == 200, response.text
    _post(client, tokens["agent"], "live-1", rows)
    client.app.state.stragglers.run_once()  # type: ignore[attr-defined]
    found = client.get("/v1/stragglers", headers=bearer(tokens["read"])).json()["data"]
    assert [(s["node"], s["kind"]) for s in found] == [("n03", "hardware")]
    telemetry = found[0]["evidence"]["telemetry"]
    assert telemetry["correlated"] is True
    assert any("sw_power_cap" in s for s in telemetry["signals"])
    assert any("SM clock" in s for s in telemetry["signals"])
    assert telemetry["slow"]["throttle_mask"] == 0x4 and telemetry["before"]["throttle_mask"] == 0
    assert "network" not in found[0]["evidence"]  # the node sent no ports


def _port(ts: datetime, rate_gbps: float) -> dict[str, Any]:
    return {"device": "mlx5_0", "port": 1, "ts": ts.isoformat(), "netdev": "ib0",
            "link_layer": "InfiniBand", "state": "ACTIVE", "state_code": 4,
            "phys_state": "LinkUp", "phys_state_code": 5, "rate_gbps": rate_gbps,
            "link_width": 4 if rate_gbps == 400.0 else 2}  # fmt: skip


def test_straggler_hardware_verdict_names_the_nodes_degraded_port(
    client: TestClient, tokens: dict[str, str]
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=120)
    onset = start + timedelta(seconds=30)
    rows = make_steps(factor=slow_node_after("n03", 30.0), seconds=70.0, nodes=4, start=start)
    # n03's rail drops from 400 to 200 Gb/s at the onset; n01's stays at 400.
    for node in ("n03", "n01"):
        for i, ts in enumerate((start, onset)):
            rate = 200.0 if node == "n03" and ts >= onset else 400.0
            batch = {"batch_id": f"{node}-{i}", "node": {"name": node, "labels": {},
                     "interval_s": 30.0, "agent_version": "t", "boot_id": "b"},
                     "gpus": [make_gpu(node, 0)], "samples": [make_sample(gpu_uuid(node, 0), ts)],
                     "events": [], "ports": [_port(ts, rate)]}  # fmt: skip
            response = client.post("/v1/ingest", json=batch, headers=bearer(tokens["agent"]))
            assert response.status_code == 200, response.text
    _post(client, tokens["agent"], "live-2", rows)
    client.app.state.stragglers.run_once()  # type: ignore[attr-defined]
    found = client.get("/v1/stragglers", headers=bearer(tokens["read"])).json()["data"]
    assert [(s["node"], s["kind"]) for s in found] == [("n03", "hardware")]
    [port] = found[0]["evidence"]["network"]["ports"]
    assert (port["device"], port["port"], port["netdev"]) == ("mlx5_0", 1, "ib0")
    assert port["now"]["rate_gbps"] == 200.0 and port["now"]["normal_rate_gbps"] == 400.0
    assert [e["kind"] for e in port["events"]] == ["port_degraded"]


def test_straggler_restarted_detector_adopts_and_closes_open_verdict(
    client: TestClient, tokens: dict[str, str]
) -> None:
    def spell(node: str, rank: int, t: float) -> float:
        return 1.4 if node == "n01" and 20.0 <= t < 50.0 else 1.0

    rows = make_steps(factor=spell, seconds=96.0, nodes=4)
    app = client.app
    _post(client, tokens["agent"], "j3", [r for r in rows if r.ts < START + timedelta(seconds=56)])
    app.state.stragglers.run_once()  # type: ignore[attr-defined]
    restarted = StragglerDetector(app.state.db, app.state.settings)  # type: ignore[attr-defined]
    _post(client, tokens["agent"], "j3", [r for r in rows if r.ts >= START + timedelta(seconds=56)])
    restarted.run_once()
    found = client.get("/v1/stragglers", headers=bearer(tokens["read"])).json()["data"]
    assert len(found) == 1  # the same verdict, not a second one from the replayed windows
    assert found[0]["ended_at"] is not None and found[0]["node"] == "n01"


# --- several workers, one truth -----------------------------------------------------------------


def test_straggler_detector_state_round_trips_through_json() -> None:
    def spell(node: str, rank: int, t: float) -> float:
        return 1.4 if node == "n02" and t >= 20.0 else 1.0

    rows = make_steps(factor=spell, seconds=60.0, nodes=4)
    whole = JobDetector(DetectorConfig())
    resumed = JobDetector(DetectorConfig())
    out_whole: list[Transition] = []
    out_resumed: list[Transition] = []
    for w in range(6):
        start, end = START + WINDOW * w, START + WINDOW * (w + 1)
        result = judge_window([r for r in rows if start <= r.ts < end], start, end, ratio=1.25)
        out_whole.extend(whole.feed(result))
        out_resumed.extend(resumed.feed(result))
        state = json.loads(json.dumps(resumed.state()))
        resumed = JobDetector.resume(DetectorConfig(), state)
    assert [t.action for t in out_whole] == ["open", "update"]  # slow from window 2
    assert out_resumed == out_whole
    assert resumed.state() == whole.state()


def _outcome(db: Database) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every verdict and every node's slowness, without row ids and wall-clock times."""
    with db.read() as conn:
        verdicts = [
            (r.job_id, r.node, r.kind, r.started_at, r.ended_at, r.windows, r.ratio, r.evidence)
            for r in conn.execute(select(stragglers).order_by(stragglers.c.node, stragglers.c.id))
        ]
        slowness = [
            (r.node, r.score, r.windows)
            for r in conn.execute(select(node_slowness).order_by(node_slowness.c.node))
        ]
    return verdicts, slowness


def test_straggler_workers_taking_turns_judge_exactly_as_one(
    client: TestClient, tokens: dict[str, str], db: Database, settings: ServerSettings
) -> None:
    """Steps arrive 15 s at a time; after each chunk a pass runs, on one worker, or on two
    taking turns (a leader change at every pass). Same verdicts, same node slowness."""

    def spell(node: str, rank: int, t: float) -> float:
        return 1.4 if node == "n02" and 30.0 <= t < 80.0 else 1.0

    rows = make_steps(factor=spell, seconds=150.0, nodes=4)
    chunks = [[r for r in rows if k * 15 <= (r.ts - START).total_seconds() < (k + 1) * 15]
              for k in range(10)]  # fmt: skip

    def play(workers: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        detectors = [StragglerDetector(db, settings) for _ in range(workers)]
        for k, chunk in enumerate(chunks):
            _post(client, tokens["agent"], "turns", chunk)
            detectors[k % workers].run_once()
        return _outcome(db)

    alone = play(1)
    with db.write() as conn:
        for table in (straggler_state, stragglers, node_slowness, job_steps, jobs):
            conn.execute(delete(table))
    taking_turns = play(2)
    verdicts, slowness = alone
    # The last step is at 149.5 s: windows 0-13 are judged, each once, on every node.
    assert [(n, windows) for n, _, windows in slowness] == [(f"n{i:02d}", 14) for i in range(4)]
    assert [(v[1], v[2], v[5]) for v in verdicts] == [("n02", "hardware", 5)]
    assert verdicts[0][4] == START + timedelta(seconds=110)  # closed after windows 8, 9, 10
    assert taking_turns == alone


def test_straggler_ratios_on_metrics_are_the_same_on_every_process(
    client: TestClient, tokens: dict[str, str], make_client: Callable[..., TestClient]
) -> None:
    rows = make_steps(factor=slow_node_after("n03", 20.0), seconds=56.0)
    _post(client, tokens["agent"], "replay-2", rows)
    client.app.state.stragglers.run_once()  # type: ignore[attr-defined]
    other = make_client()  # another process on the database: it judged nothing itself

    def ratios(on: TestClient) -> list[str]:
        text = on.get("/metrics", headers=bearer(tokens["read"])).text
        return [line for line in text.splitlines()
                if line.startswith("fleetwatch_node_step_slowdown_ratio{")]  # fmt: skip

    mine = ratios(client)
    assert len(mine) == 8 and any('node="n03",job="replay-2"' in line for line in mine)
    assert ratios(other) == mine
