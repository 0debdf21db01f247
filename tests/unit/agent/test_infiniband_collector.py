"""The infiniband collector: ports read from an injected sysfs root every interval, carried
through staging and batching unchanged, and taken by the server."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient
from tests.unit.agent.sysfs_trees import h100_tree, procfs_tree

from fleetwatch.agent.batching import combine_ticks, tick_body
from fleetwatch.agent.collectors import infiniband
from fleetwatch.agent.collectors.infiniband import InfinibandCollector
from fleetwatch.agent.factory import build_collectors
from fleetwatch.agent.loop import Agent, build_batch, encode
from fleetwatch.agent.parsers.infiniband_sysfs import InfinibandTree, read_infiniband_tree
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.agent.spool_staging import StagedTick
from fleetwatch.cli import main
from fleetwatch.config import AgentSettings, ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.telemetry import NodeInfo

T0 = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
NODE = NodeInfo(name="node-ib", interval_s=10, boot_id="b1")


@pytest.fixture
def h100(fixtures_dir: Path, tmp_path: Path) -> Path:
    return h100_tree(fixtures_dir, tmp_path)


def test_the_collector_sends_every_port_as_read(h100: Path) -> None:
    collection = InfinibandCollector(h100).collect(T0)
    expected = read_infiniband_tree(h100).ports
    assert [(p.device, p.port) for p in collection.ports] == [(r.device, r.port) for r in expected]
    assert (collection.gpus, collection.samples, collection.events) == ([], [], [])
    for port, reading in zip(collection.ports, expected, strict=True):
        assert port.ts == T0
        assert port.counters == reading.counters and port.hw_counters == reading.hw_counters
        sent = port.model_dump(exclude_none=True)
        assert {k: sent[k] for k in reading.values} == reading.values
        # What the tree lacks is absent on the wire, not null or 0.
        assert "netdev" not in sent and "node_guid" not in sent


def test_the_collector_reads_the_tree_anew_each_interval(h100: Path) -> None:
    collector = InfinibandCollector(h100)
    collector.collect(T0)
    (h100 / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error").write_text("12\n")
    (h100 / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    port = collector.collect(T0 + timedelta(seconds=10)).ports[0]
    assert port.counters is not None and port.counters["symbol_error"] == 12
    assert (port.state_code, port.state) == (1, "DOWN")


def test_a_file_that_does_not_parse_is_counted_and_told_once(
    h100: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = h100 / "mlx5_4" / "ports" / "1" / "rate"
    bad.write_text("unknown\n")
    collector = InfinibandCollector(h100)
    with caplog.at_level(logging.WARNING):
        first = collector.collect(T0)
        collector.collect(T0 + timedelta(seconds=10))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(bad) in warnings[0]
    assert collector.errors[("infiniband", "parse_error")] == 2
    port = next(p for p in first.ports if p.device == "mlx5_4")
    assert port.rate_gbps is None and port.state == "ACTIVE"
    assert len(first.ports) == 9


def test_a_port_the_wire_would_refuse_is_left_out_not_the_cycle(
    h100: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def odd_tree(root: Path) -> InfinibandTree:
        tree = read_infiniband_tree(root)
        tree.ports[0].values["rate_gbps"] = -1.0  # beyond what the parser can produce today
        return tree

    monkeypatch.setattr(infiniband, "read_infiniband_tree", odd_tree)
    collector = InfinibandCollector(h100)
    ports = collector.collect(T0).ports
    assert [p.device for p in ports][:1] == ["mlx5_1"] and len(ports) == 8
    assert collector.errors[("infiniband", "parse_error")] == 1


def test_the_collector_is_built_from_settings(h100: Path, tmp_path: Path) -> None:
    settings = AgentSettings(
        collectors="nvidia-smi,infiniband", infiniband_root=h100, spool_dir=tmp_path / "spool"
    )
    collectors = build_collectors(settings, keep_state=False)
    assert [c.name for c in collectors] == ["nvidia-smi", "infiniband"]
    assert len(collectors[1].collect(T0).ports) == 9


def test_ports_pass_through_staging_and_combining_byte_for_byte(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    collector = InfinibandCollector(procfs_tree(fixtures_dir, tmp_path))
    bodies = [
        tick_body(build_batch(NODE, collector.collect(T0 + timedelta(seconds=10 * i)), "staged"))
        for i in range(6)
    ]
    ticks = [StagedTick(i, 0.0, 0, 0, body) for i, body in enumerate(bodies)]
    (batch,) = combine_ticks(ticks, node=NODE, carrier="c-1", extra_events=[])
    sent = gzip.decompress(encode(batch))

    def ports_text(body: bytes) -> bytes:  # "ports" is the body's last field
        start = body.index(b'"ports":[') + len(b'"ports":[')
        assert body.endswith(b"]}")
        return body[start:-2]

    assert ports_text(sent) == b",".join(map(ports_text, bodies))
    assert len(json.loads(sent)["ports"]) == 6 * 4


def test_a_second_reading_of_a_port_at_one_instant_starts_a_new_batch(h100: Path) -> None:
    body = tick_body(build_batch(NODE, InfinibandCollector(h100).collect(T0), "staged"))
    ticks = [StagedTick(1, 0.0, 0, 0, body), StagedTick(2, 0.0, 0, 0, body)]
    batches = combine_ticks(ticks, node=NODE, carrier="c-1", extra_events=[])
    assert [len(b.ports) for b in batches] == [9, 9]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[TestClient, FastAPI]]:
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 's.db'}"))
    with TestClient(app) as client:
        with app.state.db.write() as conn:
            token, _ = create_token(conn, name="a", scope="agent")
        client.headers["Authorization"] = f"Bearer {token}"
        yield client, app


def test_an_agent_with_only_ports_stages_pushes_and_the_server_takes_them(
    h100: Path, tmp_path: Path, server: tuple[TestClient, FastAPI]
) -> None:
    client, _ = server
    spool = Spool(tmp_path / "spool")
    metrics = AgentMetrics()
    now = [datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)]
    agent = Agent(
        node=NODE,
        collectors=[InfinibandCollector(h100)],
        spool=spool,
        pusher=Pusher(client, spool, metrics, rejected_dir=tmp_path / "rejected"),
        metrics=metrics,
        clock=lambda: now[0],
        push_interval_s=30.0,
    )
    for _ in range(3):
        agent.cycle()
        now[0] += timedelta(seconds=10)
    assert agent.spool_depth()[0] == 1
    batch = json.loads(gzip.decompress(spool.next(0).body))  # type: ignore[union-attr]
    assert len(batch["ports"]) == 27 and batch["samples"] == []
    agent.drain_once()
    assert agent.spool_depth() == (0, 0)
    assert agent._pusher.pushed_batches == 1


def test_the_agent_command_reads_ports_from_the_given_root(h100: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["agent", "--once", "--dry-run", "--collectors", "infiniband", "--infiniband-root",
         str(h100), "--node-name", "ib-node", "--spool-dir", str(tmp_path / "s")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ports = json.loads(result.stdout)["ports"]
    assert [p["device"] for p in ports][:2] == ["mlx5_0", "mlx5_1"] and len(ports) == 9
    assert all(v is not None for p in ports for v in p.values())  # absent, never null
