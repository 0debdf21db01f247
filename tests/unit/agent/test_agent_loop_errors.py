"""The agent carries a collector's own per-device error counts into its self-metrics, once each."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.loop import Agent
from fleetwatch.agent.nvml import Nvml
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.telemetry import NodeInfo
from fleetwatch.testing import FakePynvml

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
METRIC = "fleetwatch_agent_collector_errors_total"


@pytest.fixture
def h100() -> FakePynvml:
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")
    fake.lose_gpu(2)  # every cycle: device_lost
    fake.set_error(0, "nvmlDeviceGetPcieReplayCounter", fake.NVML_ERROR_TIMEOUT)  # nvml_error
    return fake


@pytest.fixture
def collector(h100: FakePynvml) -> Iterator[NvmlCollector]:
    col = NvmlCollector(Nvml(h100))
    yield col
    col.close()


@pytest.fixture
def agent(tmp_path: Path, collector: NvmlCollector) -> Iterator[Agent]:
    # collect() never pushes; the transport only has to exist.
    client = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(503)))
    spool = Spool(tmp_path / "spool")
    metrics = AgentMetrics()
    yield Agent(
        node=NodeInfo(name="node-1", interval_s=30, boot_id="b1"),
        collectors=[collector],
        spool=spool,
        pusher=Pusher(client, spool, metrics, rejected_dir=tmp_path / "rejected"),
        metrics=metrics,
        clock=lambda: NOW,
    )
    client.close()


def exported_nvml_errors(metrics: AgentMetrics) -> dict[tuple[str, str], float]:
    """Every ``collector="nvml"`` series of the errors counter in the agent's registry."""
    return {
        (s.labels["collector"], s.labels["reason"]): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == METRIC and s.labels.get("collector") == "nvml"
    }


def test_agent_exports_nvml_per_device_errors_once_each(
    agent: Agent, collector: NvmlCollector
) -> None:
    metrics = agent._metrics
    for cycle in (1, 2):
        collection = agent.collect()

        assert len(collection.samples) == 7  # the lost GPU is skipped, the others are read
        counts = dict(collector.errors)
        assert counts[("nvml", "device_lost")] == cycle
        assert counts[("nvml", "nvml_error")] == cycle
        assert counts[("nvml", "field_not_supported")] > 0  # fixture gaps, turned off in cycle 1
        for (name, reason), total in counts.items():
            labels = {"collector": name, "reason": reason}
            assert metrics.registry.get_sample_value(METRIC, labels) == total, (cycle, reason)
        assert exported_nvml_errors(metrics) == counts  # no other series, nothing counted twice
