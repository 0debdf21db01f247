"""Checkpoint advice: Young/Daly on hand-computed numbers, and GET /v1/advice/checkpoint."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert
from tests.conftest import bearer

from fleetwatch.models.checkpoint import GpuHazard, advise, daly_interval, goodput, hazard_per_day
from fleetwatch.server.db.tables import job_notices

P_001 = 1.0 - math.exp(-0.01)  # one-day probability of a GPU failing at 0.01 a day


def test_checkpoint_daly_branch_on_hand_computed_numbers() -> None:
    # 8 GPUs at 0.01/day: 0.08/day, M = 86400 / 0.08 = 1,080,000 s. delta = 600 s:
    # Young sqrt(2 * 600 * 1.08e6) = 36,000 s; Daly 36,000 - 600 = 35,400 s.
    hazards = [GpuHazard(f"n{i // 4}", f"GPU-{i}", P_001) for i in range(8)]
    advice = advise(hazards, checkpoint_cost_s=600.0)
    assert advice is not None
    assert advice.rate_per_day == pytest.approx(0.08)
    assert advice.mtbf_s == pytest.approx(1_080_000.0)
    assert advice.young_interval_s == pytest.approx(36_000.0)
    assert advice.interval_s == pytest.approx(35_400.0)
    assert advice.method == "daly"
    # G = 35400/36000 * (1 - 18000/1.08e6) = (59/60) * (59/60)
    assert advice.goodput == pytest.approx((59 / 60) ** 2)
    assert [n.rate_per_day for n in advice.nodes] == pytest.approx([0.04, 0.04])


def test_checkpoint_large_cost_falls_back_to_m() -> None:
    # One GPU a rule takes out: p = 0.99 a day, lambda = ln(100) = 4.60517/day, M = 18,761.6 s.
    advice = advise([GpuHazard("n0", "GPU-x", 1.0, out_of_service=True)],
                    checkpoint_cost_s=40_000.0)  # fmt: skip
    assert advice is not None
    mtbf = 86400.0 / math.log(100.0)
    assert advice.mtbf_s == pytest.approx(mtbf)
    assert 40_000.0 >= 2 * mtbf
    assert advice.interval_s == pytest.approx(mtbf)
    assert advice.method == "daly_large_cost"
    assert advice.nodes[0].out_of_service_gpus == ["GPU-x"]
    assert advice.goodput == 0.0  # the failures lose more than the job can do


def test_checkpoint_formulas_edge_values() -> None:
    assert hazard_per_day(0.5) == pytest.approx(math.log(2.0))
    assert daly_interval(100.0, 50.0) == (50.0, "daly_large_cost")
    assert daly_interval(100.0, 50.01)[1] == "daly"
    restart = goodput(35_400.0, 600.0, 1_080_000.0, restart_s=10_800.0)
    assert restart == pytest.approx((59 / 60) * (1 - 28_800 / 1_080_000))


def test_checkpoint_no_rate_anywhere_is_none() -> None:
    assert advise([GpuHazard("n0", "g", None)], checkpoint_cost_s=60.0) is None


def _risk(node: str, uuid: str, p: float | None, basis: str) -> SimpleNamespace:
    return SimpleNamespace(gpu=SimpleNamespace(node=node, uuid=uuid), probability=p, basis=basis)


class FakeAssessor:
    """Stands in for the background assessment: risks(horizon_days) at H = 1 day."""

    def __init__(self, risks: list[SimpleNamespace]) -> None:
        self.snapshot = SimpleNamespace(
            at=datetime(2025, 1, 1, tzinfo=UTC), model_version=3, risks=self._risks
        )
        self._list = risks

    def _risks(self, horizon_days: float) -> list[SimpleNamespace]:
        assert horizon_days == 1.0
        return self._list

    def current(self) -> SimpleNamespace:
        return self.snapshot


def test_checkpoint_api_sums_the_nodes_gpus(client: TestClient, tokens: dict[str, str]) -> None:
    client.app.state.assessor = FakeAssessor(  # type: ignore[attr-defined]
        [_risk("a", f"a{i}", P_001, "model") for i in range(4)]
        + [_risk("b", f"b{i}", P_001, "model") for i in range(4)]
        + [_risk("elsewhere", "z", 0.9, "model")]
    )
    response = client.get(
        "/v1/advice/checkpoint", params={"nodes": "a,b", "checkpoint_cost_s": 600},
        headers=bearer(tokens["read"]),
    )  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["failure_rate_per_day"] == pytest.approx(0.08)
    assert body["interval_s"] == pytest.approx(35_400.0)
    assert body["young_interval_s"] == pytest.approx(36_000.0)
    assert [c["share"] for c in body["contributions"]] == pytest.approx([0.5, 0.5])


def test_checkpoint_api_for_a_job(client: TestClient, tokens: dict[str, str]) -> None:
    steps = [{"rank": 0, "node": "a", "step": 0, "duration_ms": 5.0,
              "ts": "2025-01-01T00:00:00Z"}]  # fmt: skip
    client.post("/v1/jobs/j9/steps", json={"steps": steps}, headers=bearer(tokens["agent"]))
    client.app.state.assessor = FakeAssessor(  # type: ignore[attr-defined]
        [_risk("a", "a0", 1.0, "rule"), _risk("b", "b0", 0.5, "model")]
    )
    body = client.get(
        "/v1/advice/checkpoint", params={"job": "j9", "checkpoint_cost_s": 60},
        headers=bearer(tokens["read"]),
    ).json()  # fmt: skip
    assert body["nodes"] == ["a"]
    assert body["failure_rate_per_day"] == pytest.approx(math.log(100.0))
    assert body["contributions"][0]["out_of_service_gpus"] == ["a0"]


def test_checkpoint_api_without_model_or_rule_is_422(
    client: TestClient, tokens: dict[str, str]
) -> None:
    client.app.state.assessor = FakeAssessor([_risk("a", "a0", None, "none")])  # type: ignore[attr-defined]
    response = client.get(
        "/v1/advice/checkpoint", params={"nodes": "a", "checkpoint_cost_s": 60},
        headers=bearer(tokens["read"]),
    )  # fmt: skip
    assert response.status_code == 422
    assert "no risk model is fitted" in response.json()["error"]


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"nodes": "a"}, ["query", "checkpoint_cost_s"]),
        ({"nodes": "a", "checkpoint_cost_s": 0}, ["query", "checkpoint_cost_s"]),
        ({"nodes": "a", "checkpoint_cost_s": 5, "restart_cost_s": -1}, ["query", "restart_cost_s"]),
        ({"checkpoint_cost_s": 5}, ["query", "job"]),
    ],
)
def test_checkpoint_api_bad_query_names_the_field(
    client: TestClient, tokens: dict[str, str], params: dict[str, object], loc: list[str]
) -> None:
    response = client.get("/v1/advice/checkpoint", params=params, headers=bearer(tokens["read"]))
    assert response.status_code == 422
    assert loc in [d["loc"] for d in response.json()["detail"]]


def _open_notice(db: Any, job: str, kind: str, node: str, evidence: dict[str, Any]) -> int:
    with db.write() as conn:
        done = conn.execute(
            insert(job_notices).values(
                job_id=job, kind=kind, node=node, gpu=None, reason=kind, evidence=evidence,
                action="checkpoint_now", opened_at=datetime.now(UTC),
            )
        )  # fmt: skip
        return int(done.inserted_primary_key[0])


def test_checkpoint_advice_for_a_job_drops_with_its_open_notices(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """A risk notice (P = 0.5 within 12 h on node a, one GPU) raises a's rate to ln 2 x 2 a
    day; a drain notice on b counts b's GPU as out (p = 0.99 a day); the interval drops."""
    steps = [{"rank": r, "node": n, "step": 0, "duration_ms": 5.0,
              "ts": "2025-01-01T00:00:00Z"} for r, n in enumerate(("a", "b"))]  # fmt: skip
    client.post("/v1/jobs/j7/steps", json={"steps": steps}, headers=bearer(tokens["agent"]))
    client.app.state.assessor = FakeAssessor(  # type: ignore[attr-defined]
        [_risk("a", "a0", P_001, "model"), _risk("b", "b0", P_001, "model")]
    )

    def advice() -> dict[str, Any]:
        params = {"job": "j7", "checkpoint_cost_s": 60}
        response = client.get(
            "/v1/advice/checkpoint", params=params, headers=bearer(tokens["read"])
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    calm = advice()
    assert calm["failure_rate_per_day"] == pytest.approx(0.02) and calm["open_notices"] == []
    db = client.app.state.db  # type: ignore[attr-defined]
    risk = _open_notice(db, "j7", "risk", "a", {"probability": 0.5, "horizon_h": 12.0})
    risky = advice()
    assert risky["open_notices"] == [risk]
    assert risky["failure_rate_per_day"] == pytest.approx(2 * math.log(2) + 0.01)
    assert risky["interval_s"] < calm["interval_s"]
    drain = _open_notice(db, "j7", "drain_pending", "b", {"eviction_id": 1})
    draining = advice()
    assert draining["open_notices"] == [risk, drain]
    assert draining["failure_rate_per_day"] == pytest.approx(2 * math.log(2) + math.log(100))
    assert draining["interval_s"] < risky["interval_s"]
