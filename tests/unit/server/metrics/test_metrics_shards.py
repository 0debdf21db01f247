"""/metrics in shards: every node in exactly one shard, the same in every process and after the
fleet grows; shard pages add up to the whole fleet; the default page carries no per-GPU
telemetry and no family a shard carries; bad shard parameters are a 422 naming the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

from fleetwatch.metrics import GPU_METRICS
from fleetwatch.server.metrics.gpu_exposition import GPU_FAMILIES
from fleetwatch.server.metrics.shards import Shard, node_hash

SRC = Path(__file__).resolve().parents[4] / "src"
NODES = [f"node-{i:03d}" for i in range(40)]

Scrape = Callable[..., str]


@pytest.fixture
def scrape(client: TestClient, tokens: dict[str, str]) -> Scrape:
    """``scrape(shard, shards, on=client)``: a page's text (the default page without a shard)."""

    def _scrape(
        shard: int | None = None, shards: int | None = None, *, on: TestClient = client
    ) -> str:
        params = {} if shard is None else {"shard": shard, "shards": shards}
        response = on.get("/metrics", params=params, headers=bearer(tokens["read"]))
        assert response.status_code == 200, response.text
        return response.text

    return _scrape


@pytest.fixture
def fleet(push: Push) -> list[str]:
    for name in NODES:
        assert push(make_batch(name, gpus=2)).status_code == 200
    return NODES


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _gpu_nodes(text: str) -> set[str]:
    """The nodes whose GPUs a page carries (from ``fleetwatch_gpu_info``)."""
    return {
        sample.labels["node"]
        for family in text_string_to_metric_families(text)
        if family.name == "fleetwatch_gpu_info"
        for sample in family.samples
    }


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_node_hash_is_crc32_of_the_name() -> None:
    # Pinned: a release that changed it would move every node to another shard.
    assert node_hash("gpu-node-00001") == zlib.crc32(b"gpu-node-00001") == 4071499453
    assert Shard(4071499453 % 16, 16).holds("gpu-node-00001")


def test_node_shards_are_the_same_in_other_processes() -> None:
    """Python's hash() is salted per process; the shard must not be."""
    here = {name: node_hash(name) % 16 for name in NODES}
    program = (
        "import json, sys; from fleetwatch.server.metrics.shards import node_hash; "
        "print(json.dumps({n: node_hash(n) % 16 for n in json.loads(sys.argv[1])}))"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", program, json.dumps(NODES)],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        assert json.loads(out.stdout) == here


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_every_node_is_in_exactly_one_shard(fleet: list[str], scrape: Scrape, shards: int) -> None:
    pages = [scrape(i, shards) for i in range(shards)]
    owners: dict[str, list[int]] = {}
    for index, page in enumerate(pages):
        for node in _gpu_nodes(page):
            owners.setdefault(node, []).append(index)
    assert owners == {name: [node_hash(name) % shards] for name in fleet}
    if shards > 1:
        assert all(len(_gpu_nodes(page)) < len(fleet) for page in pages)


def test_shards_add_up_to_the_whole_fleet_each_series_once(
    fleet: list[str], scrape: Scrape
) -> None:
    whole = _series(scrape(0, 1))
    parts = [line for i in range(4) for line in _series(scrape(i, 4))]
    assert len(parts) == len(set(parts))
    assert sorted(parts) == sorted(whole)
    assert len(whole) > 40 * 2 * len(GPU_METRICS) // 2  # a real page, not two empty ones


def test_two_app_instances_shard_alike(
    fleet: list[str], scrape: Scrape, make_client: Callable[..., TestClient]
) -> None:
    other = make_client()  # another process on the same database: its own caches
    for index in range(5):
        assert _gpu_nodes(scrape(index, 5)) == _gpu_nodes(scrape(index, 5, on=other))


def test_a_node_keeps_its_shard_when_nodes_join(
    fleet: list[str], push: Push, scrape: Scrape
) -> None:
    before = {i: _gpu_nodes(scrape(i, 8)) for i in range(8)}
    for i in range(40):
        assert push(make_batch(f"joined-{i:03d}", gpus=1)).status_code == 200
    after = {i: _gpu_nodes(scrape(i, 8)) for i in range(8)}
    for index in range(8):
        assert before[index] <= after[index]
    assert set().union(*after.values()) == set(fleet) | {f"joined-{i:03d}" for i in range(40)}


def test_default_page_carries_no_per_gpu_telemetry(fleet: list[str], scrape: Scrape) -> None:
    page = scrape()
    per_gpu = {name for name, _kind, _help in GPU_FAMILIES} | {
        "fleetwatch_gpu_failure_probability",
        "fleetwatch_xid_events_total",
    }
    assert _families(page) & per_gpu == set()
    assert not [line for line in _series(page) if "uuid=" in line]  # healthy: no verdicts
    reported = {"fleetwatch_gpu_temperature_celsius", "fleetwatch_gpu_info"}
    assert reported <= _families(scrape(0, 1)) & per_gpu
    # Its series grow with the nodes, not with their GPUs' fields.
    assert len(_series(page)) < 40 * 2 + 200


def test_no_family_is_on_both_pages(fleet: list[str], scrape: Scrape) -> None:
    default, shard = _families(scrape()), _families(scrape(0, 1))
    assert default & shard == set()
    # The process's own counters would be counted once per shard.
    assert not [
        name for name in shard if name.startswith(("fleetwatch_ingest", "fleetwatch_leader"))
    ]
    assert "fleetwatch_ingest_batches_total" in default


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"shard": 16, "shards": 16}, "shard"),
        ({"shard": -1, "shards": 16}, "shard"),
        ({"shard": 0, "shards": 0}, "shards"),
        ({"shard": 0, "shards": 1025}, "shards"),
        ({"shard": "three", "shards": 16}, "shard"),
        ({"shard": 3}, "shards"),
        ({"shards": 16}, "shard"),
    ],
)
def test_bad_shard_parameters_are_a_422_naming_the_field(
    client: TestClient, tokens: dict[str, str], params: dict[str, object], field: str
) -> None:
    response: httpx.Response = client.get("/metrics", params=params, headers=bearer(tokens["read"]))
    assert response.status_code == 422, response.text
    body = response.json()
    assert [d["loc"] for d in body["detail"]] == [["query", field]]
    assert f"query.{field}" in body["error"]
