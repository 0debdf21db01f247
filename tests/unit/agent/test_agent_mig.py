"""A node with MIG-enabled GPUs end to end in-process (issue 13): collectors -> spool -> pusher
-> the real app (TestClient) -> the GPU API. The NVML side is the *fake* NVML node
``h100_mig.json`` (no MIG hardware here); the dcgm-exporter side a real A100 MIG scrape."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fleetwatch.agent.collectors.dcgm_exporter import DcgmExporterCollector
from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.loop import Agent
from fleetwatch.agent.nvml import Nvml
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.telemetry import NodeInfo
from fleetwatch.testing import FakePynvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NVML_MIG_GPU = "GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4"
DCGM_MIG_GPU = "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 's.db'}"))
    with TestClient(app) as client:
        with app.state.db.write() as conn:
            agent_token, _ = create_token(conn, name="a", scope="agent")
            read_token, _ = create_token(conn, name="r", scope="read")
        client.headers["Authorization"] = f"Bearer {agent_token}"
        yield client, {"Authorization": f"Bearer {read_token}"}


def _gpus(client: TestClient, read: dict[str, str]) -> dict[str, Any]:
    response = client.get("/v1/gpus", headers=read)
    assert response.status_code == 200, response.text
    return {g["uuid"]: g for g in response.json()}


def test_mig_gpus_from_nvml_and_dcgm_exporter_reach_the_gpu_api(
    tmp_path: Path, server: tuple[TestClient, dict[str, str]]
) -> None:
    client, read = server
    scrape = FIXTURES / "mig_captures" / "runai__A100-SXM4-40GB_MIG_3x1g.5gb+2g.10gb_4-active.txt"
    exposition = tmp_path / "metrics.prom"
    exposition.write_text(scrape.read_text().split("\n", 2)[2])  # without the title line
    collectors = [
        NvmlCollector(Nvml(FakePynvml.from_json(FIXTURES / "nvml" / "h100_mig.json"))),
        DcgmExporterCollector(str(exposition)),
    ]
    spool, metrics = Spool(tmp_path / "spool"), AgentMetrics()
    agent = Agent(
        node=NodeInfo(name="node-mig", interval_s=10, boot_id="b1"),
        collectors=collectors,  # type: ignore[arg-type]
        spool=spool,
        pusher=Pusher(client, spool, metrics, rejected_dir=tmp_path / "rejected"),
        metrics=metrics,
        clock=lambda: datetime.now(UTC),
    )
    try:
        agent.cycle()
        agent.drain_once()
    finally:
        for collector in collectors:
            collector.close()

    assert agent.spool_depth() == (0, 0)
    assert not (tmp_path / "rejected").exists()
    gpus = _gpus(client, read)
    nvml_gpu, dcgm_gpu = gpus[NVML_MIG_GPU], gpus[DCGM_MIG_GPU]
    assert [i["profile"] for i in nvml_gpu["mig"]["instances"]] == [
        "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"
    ]  # fmt: skip
    assert nvml_gpu["latest"]["values"]["gpu_temp_c"] == 38
    assert "gpu_util_pct" not in nvml_gpu["latest"]["values"]
    assert [(i["gpu_instance_id"], i["profile"]) for i in dcgm_gpu["mig"]["instances"]] == [
        (5, "2g.10gb"), (7, "1g.5gb"), (8, "1g.5gb"), (9, "1g.5gb")
    ]  # fmt: skip
    assert dcgm_gpu["latest"]["values"]["power_w"] == 112.252
    assert dcgm_gpu["latest"]["values"]["energy_mj"] == 6890956
