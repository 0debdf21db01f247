"""GET /v1/risk and /v1/gpus/{uuid}/risk: rules first, then the stored model, on both databases.

The data comes in through POST /v1/ingest; the assessment that the background loop would build is
built by hand here (``run_once``), as the test settings turn the loop off.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push

from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.models import store_model

Read = Callable[..., httpx.Response]


def _assess(client: TestClient) -> None:
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]


def _xid_batch(node: str, xid: int, *, boot_id: str = "boot-1", minutes_ago: float = 5) -> dict:
    batch = make_batch(node, gpus=2, ticks=3, boot_id=boot_id)
    ts = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    batch["events"] = [
        {"kind": "xid", "ts": ts.isoformat(), "xid": xid,
         "pci_bus_id": batch["gpus"][1]["pci_bus_id"],
         "message": f"NVRM: Xid (PCI:{batch['gpus'][1]['pci_bus_id']}): {xid}, pid=1234"}
    ]  # fmt: skip
    return batch


def _store_model(db: Database, *, n: int = 600, seed: int = 7) -> int:
    """A model fitted on synthetic lifetimes where a high SBE rate shortens life."""
    rng = np.random.default_rng(seed)
    sbe = rng.exponential(5.0, n)
    scale = 400.0 * np.exp(-0.15 * sbe)
    life = scale * rng.weibull(1.4, n)
    censor = rng.uniform(50, 600, n)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor),
        "event": (life <= censor).astype(int),
        "group": "NVIDIA H100 80GB HBM3",
        "sbe_per_day": sbe,
    })  # fmt: skip
    bundle = RiskBundle.fit(frame)
    with db.write() as conn:
        return store_model(conn, bundle, trigger="manual", trained_at=datetime.now(UTC))


def _store_landmark_model(db: Database, *, n: int = 4000, seed: int = 7) -> int:
    """A model whose landmark part learnt, from synthetic landmark rows, infant mortality: a GPU
    in its first 30 days (as the test batches' GPUs, just seen, are) is likelier to fail soon;
    temperature has no effect."""
    rng = np.random.default_rng(seed)
    temp = rng.uniform(30.0, 90.0, n)
    age = rng.uniform(0.0, 400.0, n)
    fails = rng.random(n) < np.where(age < 30.0, 0.2, 0.02)
    days = np.where(fails, rng.uniform(0.1, 7.0, n), 7.0)
    X = pd.DataFrame({"age_days": age, "temp_p95_c": temp})
    y = pd.DataFrame({
        "duration": days, "event": fails, "follow_up": 7.0,
        "landmark": pd.Timestamp("2025-01-01", tz="UTC"), "weight": 1.0,
    })  # fmt: skip
    frame = pd.DataFrame({"duration_days": age + 1.0, "event": fails.astype(int)})
    bundle = RiskBundle.fit(frame, landmarks=(X, y), landmark_horizons=(1.0, 7.0))
    assert bundle.scorer == "landmark"
    with db.write() as conn:
        return store_model(conn, bundle, trigger="manual", trained_at=datetime.now(UTC))


def test_a_fatal_xid_puts_its_gpu_first_with_probability_one(
    client: TestClient, push: Push, read: Read
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    _assess(client)
    page = read("/v1/risk", horizon="24h").json()
    first = page["gpus"][0]
    assert first["uuid"] == gpu_uuid("node-a", 1)
    assert first["probability"] == 1.0 and first["basis"] == "rule"
    rules = {v["rule"]: v for v in first["verdicts"]}
    assert any(79 in v["xids"] and v["takes_gpu_out"] for v in rules.values()), rules
    assert all(v["source"] for v in first["verdicts"])
    # Without any fitted model the others have no probability: absent, not made up.
    assert page["model_version"] is None
    assert all(g["probability"] is None and g["basis"] == "none" for g in page["gpus"][1:])
    assert page["total"] == 4


def test_an_application_xid_alone_does_not_count_against_the_gpu(
    client: TestClient, push: Push, read: Read
) -> None:
    assert push(_xid_batch("node-a", 13)).status_code == 200
    _assess(client)
    gpu = read(f"/v1/gpus/{gpu_uuid('node-a', 1)}/risk").json()
    assert gpu["basis"] == "none"
    assert all(not v["counts_against_gpu"] for v in gpu["verdicts"])


def test_a_reboot_after_a_reset_class_xid_clears_the_verdict(
    client: TestClient, push: Push, read: Read
) -> None:
    assert push(_xid_batch("node-a", 79, minutes_ago=20)).status_code == 200
    _assess(client)
    uuid = gpu_uuid("node-a", 1)
    assert read(f"/v1/gpus/{uuid}/risk").json()["basis"] == "rule"
    assert push(make_batch("node-a", gpus=2, ticks=2, boot_id="boot-2")).status_code == 200
    _assess(client)
    after = read(f"/v1/gpus/{uuid}/risk").json()
    assert after["basis"] == "none", after["verdicts"]


def test_a_pending_row_remap_is_a_health_verdict(
    client: TestClient, push: Push, read: Read
) -> None:
    batch = make_batch("node-a", gpus=1, ticks=2)
    for sample in batch["samples"]:
        sample["remapped_rows_pending"] = True
    assert push(batch).status_code == 200
    _assess(client)
    gpu = read(f"/v1/gpus/{gpu_uuid('node-a', 0)}/risk").json()
    verdict = next(v for v in gpu["verdicts"] if v["rule"] == "row_remap_pending")
    assert verdict["kind"] == "health" and verdict["action"] == "reset_gpu"


def test_model_probabilities_are_bounded_and_grow_with_the_horizon(
    client: TestClient, push: Push, read: Read, db: Database
) -> None:
    version = _store_model(db)
    for node in ("node-a", "node-b", "node-c"):
        assert push(make_batch(node, gpus=2, ticks=3)).status_code == 200
    _assess(client)
    by_horizon: dict[str, dict[str, Any]] = {}
    for horizon in ("1h", "24h", "7d", "90d"):
        page = read("/v1/risk", horizon=horizon, limit=100).json()
        assert page["model_version"] == version
        by_horizon[horizon] = {g["uuid"]: g for g in page["gpus"]}
    for uuid, gpu in by_horizon["24h"].items():
        assert gpu["basis"] == "model" and gpu["model_version"] == version
        ps = [by_horizon[h][uuid]["probability"] for h in ("1h", "24h", "7d", "90d")]
        assert all(0.0 <= p <= 1.0 for p in ps)
        assert ps == sorted(ps) and ps[-1] > ps[0]
        # SBE rate was never reported by these GPUs: imputed, and the factor says so.
        sbe = [f for f in gpu["factors"] if f["name"] == "sbe_per_day"]
        assert sbe and sbe[0]["value"] is None


def test_node_scope_combines_gpu_probabilities(
    client: TestClient, push: Push, read: Read, db: Database
) -> None:
    _store_model(db)
    assert push(make_batch("node-a", gpus=3, ticks=2)).status_code == 200
    assert push(_xid_batch("node-b", 48)).status_code == 200
    _assess(client)
    page = read("/v1/risk", scope="node", horizon="7d").json()
    assert [n["node"] for n in page["nodes"]][0] == "node-b"  # its GPU with Xid 48 is out
    for node in page["nodes"]:
        ps = [g["probability"] for g in node["gpus"]]
        assert node["probability"] == pytest.approx(1 - np.prod([1 - p for p in ps]))


def test_risk_shows_on_metrics(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    _store_model(db)
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    _assess(client)
    read = bearer(tokens["read"])
    text = client.get("/metrics", headers=read).text
    # Per-GPU probabilities are on the shard pages (the one shard of one holds every node).
    gpus = client.get("/metrics", params={"shard": 0, "shards": 1}, headers=read).text
    uuid = gpu_uuid("node-a", 1)
    series = f'node="node-a",gpu="1",uuid="{uuid}",horizon="1d"'
    assert f"fleetwatch_gpu_failure_probability{{{series}}} 1\n" in gpus
    assert "fleetwatch_gpu_failure_probability{" not in text
    healthy = f'uuid="{gpu_uuid("node-a", 0)}",horizon="7d"}}'
    p = float(next(line for line in gpus.splitlines() if healthy in line).rsplit(" ", 1)[1])
    assert 0.0 < p < 1.0
    assert 'fleetwatch_node_failure_probability{node="node-a",horizon="7d"} 1' in text
    assert f'uuid="{uuid}",kind="xid"' in text and "fleetwatch_gpu_verdict{" in text
    # The fleet's distribution: one GPU judged fatal by its Xid 79, three without a verdict.
    lines = text.splitlines()
    assert 'fleetwatch_gpus{verdict="none"} 3' in lines
    assert sum(int(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("fleetwatch_gpus{")) == 4
    assert 'fleetwatch_gpus{verdict="fatal"} 1' in lines  # Xid 79 is fatal in the catalogue
    for horizon in ("1d", "7d"):
        # The out-of-service GPU (probability 1) is at risk at every threshold.
        assert f'fleetwatch_gpus_at_risk{{horizon="{horizon}",threshold="0.5"}} 1' in lines
        at_risk = [
            x for x in lines if x.startswith(f'fleetwatch_gpus_at_risk{{horizon="{horizon}"')
        ]
        assert len(at_risk) == 3


@pytest.mark.parametrize("horizon", ["soon", "0h", "400d"])
def test_a_bad_horizon_is_a_422_naming_it(
    client: TestClient, tokens: dict[str, str], horizon: str
) -> None:
    response = client.get("/v1/risk", params={"horizon": horizon}, headers=bearer(tokens["read"]))
    assert response.status_code == 422
    assert "horizon" in response.text


def test_an_unknown_gpu_is_a_404(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.get("/v1/gpus/GPU-nope/risk", headers=bearer(tokens["read"]))
    assert response.status_code == 404
    assert "GPU-nope" in response.text


def test_a_node_reporting_from_the_past_is_judged_as_of_its_newest_reading(
    client: TestClient, push: Push, read: Read
) -> None:
    """A spool emptying after a 3-day outage (or a simulated fleet): the Xid and the samples
    around it are days old, and still judged, on the node's own clock."""
    start = datetime.now(UTC) - timedelta(days=3)
    batch = make_batch("node-late", gpus=2, ticks=3, start=start)
    pci = batch["gpus"][1]["pci_bus_id"]
    batch["events"] = [{"kind": "xid", "ts": (start + timedelta(seconds=15)).isoformat(),
                        "xid": 79, "pci_bus_id": pci,
                        "message": f"NVRM: Xid (PCI:{pci}): 79, fallen off the bus."}]  # fmt: skip
    assert push(batch).status_code == 200
    _assess(client)
    gpu = read(f"/v1/gpus/{gpu_uuid('node-late', 1)}/risk").json()
    assert gpu["basis"] == "rule"
    assert any(79 in v["xids"] for v in gpu["verdicts"])
