"""Real Prometheus scrapes a real FleetWatch server fed by a simulated fleet: every query of every
generated Grafana dashboard returns data, the fatal-verdict alert fires after an Xid 79 and the
port-down alert for a port that is down.

The fleet: three ``fleetwatch agent --collectors sim`` processes (a ``fleetwatch sim init`` fleet),
plus one node whose batches this test pushes itself with every GPU field filled (so the GPU
detail dashboard, templated on that node and GPU 1, has every series), an Xid 79 on GPU 1, a
corrected machine check and four network ports (one down, one trained at half rate, a RoCE port;
their counters grow with every batch, so the fabric dashboard's rates have data);
step reports of a job with one slow node for the straggler panels; a stored risk model for the
probabilities. Prometheus (``/usr/bin/prometheus``) scrapes with the shipped scrape config
(dashboards/prometheus/prometheus.yml: the default page and 16 shards) every second with the read
token and loads a copy of dashboards/prometheus/rules/fleetwatch.rules.yml whose ``for:``
durations are cut to 1 s (the committed rules wait minutes, which promtool's unit tests cover).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
import yaml

from fleetwatch.config import ServerSettings
from fleetwatch.dashboards import build_all, panel_queries
from fleetwatch.metrics import GPU_METRICS
from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.repo.models import store_model
from tests.conftest import require_tool
from tests.factories import make_batch
from tests.integration.live import fleetwatch, free_port, live_server, start_agent, stop_agents

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "dashboards/prometheus/rules/fleetwatch.rules.yml"
SCRAPE_CONFIG = REPO / "dashboards/prometheus/prometheus.yml"
NODE = "it-prom-node-0"  # the node this test pushes for; the GPU detail dashboard shows GPU 1
GPU = "1"
JOB = "it-prom-job"
SUBSTITUTE = {"$node": NODE, "$gpu": GPU, "$__rate_interval": "15s"}


def _full_sample(sample: dict[str, Any], tick: int) -> dict[str, Any]:
    """Every field a GPU metric is made from, so no GPU detail panel lacks its series."""
    for metric in GPU_METRICS:
        sample.setdefault(metric.field, 0)  # healthy: no errors, only GPU 1's Xid 79
    sample.update(
        energy_mj=1_000_000 * tick, power_violation_us=1000 * tick,
        pcie_link_gen=5, pcie_link_width=16, clocks_event_reasons=0x4, gpu_recovery_action=0,
        retired_pages_pending=False, remapped_rows_pending=False, remapped_rows_failure=False,
        fan_speed_pct=40.0, mem_copy_util_pct=12.0,
    )  # fmt: skip
    return sample


def _ports(tick: int) -> list[dict[str, Any]]:
    """mlx5_0 healthy with every error counter, mlx5_1 down, mlx5_2 at half rate (degraded
    beside mlx5_0), a RoCE port retransmitting."""
    now = datetime.now(UTC).isoformat()

    def port(device: str, **fields: Any) -> dict[str, Any]:
        return {"device": device, "port": 1, "ts": now, "link_layer": "InfiniBand",
                "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp", "phys_state_code": 5,
                "rate_gbps": 400.0, "link_width": 4} | fields  # fmt: skip

    counters = {"symbol_error": tick, "link_downed": 0, "link_error_recovery": tick,
                "port_rcv_errors": tick, "port_xmit_discards": tick}  # fmt: skip
    return [
        port("mlx5_0", netdev="ib0", counters=counters),
        port("mlx5_1", state="DOWN", state_code=1, phys_state="Polling", phys_state_code=2,
             rate_gbps=10.0, counters={"link_downed": tick}),
        port("mlx5_2", rate_gbps=200.0, link_width=2, counters=counters),
        port("mlx5_bond_0", link_layer="Ethernet", netdev="bond0", rate_gbps=100.0,
             hw_counters={"roce_adp_retrans": 3 * tick}),
    ]  # fmt: skip


def _node_batch(tick: int, *, xid: bool) -> dict[str, Any]:
    batch = make_batch(NODE, gpus=2, ticks=1, interval_s=2.0)
    batch["node"]["labels"] = {"cluster": "it", "row": "a", "rack": "r7"}
    batch["samples"] = [_full_sample(s, tick) for s in batch["samples"]]
    batch["ports"] = _ports(tick)
    if xid:
        bus = batch["gpus"][1]["pci_bus_id"]
        now = datetime.now(UTC).isoformat()
        batch["events"] = [
            {"kind": "xid", "ts": now, "xid": 79, "pci_bus_id": bus,
             "message": f"NVRM: Xid (PCI:{bus}): 79, pid=1234, GPU has fallen off the bus."},
            {"kind": "mce", "ts": now, "details": {"severity": "corrected", "bank": 5},
             "message": "mce: [Hardware Error]: Machine check events logged"},
        ]  # fmt: skip
    return batch


def _steps(start: datetime) -> list[dict[str, Any]]:
    """Four nodes x 8 ranks, a step every 0.5 s for 70 s; node 3 runs 1.4x slow throughout."""
    rng = np.random.default_rng(3)
    steps = []
    for i in range(140):
        noise = rng.lognormal(0.0, 0.03, size=32)
        for rank in range(32):
            node = f"it-train-{rank // 8}"
            slow = 1.4 if node == "it-train-3" else 1.0
            steps.append({
                "rank": rank, "node": node, "step": i, "duration_ms": 400.0 * slow * noise[rank],
                "ts": (start + timedelta(seconds=0.5 * i)).isoformat(),
            })  # fmt: skip
    return steps


def _store_model(db: Database) -> int:
    """A model fitted on synthetic lifetimes, as tests/unit/server/routers/test_risk_api.py does."""
    rng = np.random.default_rng(7)
    sbe = rng.exponential(5.0, 600)
    life = 400.0 * np.exp(-0.15 * sbe) * rng.weibull(1.4, 600)
    censor = rng.uniform(50, 600, 600)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor), "event": (life <= censor).astype(int),
        "group": "NVIDIA H100 80GB HBM3", "sbe_per_day": sbe,
    })  # fmt: skip
    with db.write() as conn:
        return store_model(
            conn, RiskBundle.fit(frame), trigger="manual", trained_at=datetime.now(UTC)
        )


@pytest.fixture
def prepared_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'fleetwatch.db'}"
    db = Database(make_engine(ServerSettings(database_url=url)))  # type: ignore[call-arg]
    upgrade(db.engine)
    _store_model(db)
    with db.write() as conn:
        tokens = {s: create_token(conn, name=f"it-{s}", scope=s)[0] for s in ("agent", "read")}
    db.dispose()
    for name, value in {"ASSESS_INTERVAL_S": "1", "PLANNER_INTERVAL_S": "1",
                        "STRAGGLER_INTERVAL_S": "1", "METRICS_CACHE_TTL_S": "0",
                        "REFIT_INTERVAL_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return url, tokens


def _short_for_rules(path: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _prometheus_config(tmp_path: Path, target: str, token: str) -> Path:
    """The shipped dashboards/prometheus/prometheus.yml (both jobs: the default page and the 16
    shards, relabeled as shipped) pointed at ``target``, scraping every second."""
    rules = _short_for_rules(tmp_path / "fleetwatch.rules.yml")
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    del config["alerting"]
    for job in config["scrape_configs"]:
        job["scrape_timeout"] = "1s"
        job["authorization"] = {"type": "Bearer", "credentials": token}
        for relabel in job.get("relabel_configs", []):
            if relabel.get("target_label") == "__address__":
                relabel["replacement"] = target
        if job["job_name"] == "fleetwatch":
            job["static_configs"] = [{"targets": [target]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    binary = require_tool("prometheus")
    started: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> str:
        port = free_port()
        with (tmp_path / "prometheus.log").open("ab") as log:
            started.append(
                subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120  # generous: CI has 2 shared cores
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError((tmp_path / "prometheus.log").read_text())

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its data is thrown away: no need to wait for a flush
            process.kill()
            process.wait()


def _query(prom: str, expr: str) -> list[Any]:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    result: list[Any] = body["data"]["result"]
    return result


def _substituted(expr: str) -> str:
    for name, value in SUBSTITUTE.items():
        expr = expr.replace(name, value)
    return expr


def _dashboard_queries() -> list[tuple[str, str]]:
    return [
        (f"{name} / {title}", _substituted(expr))
        for name, doc in build_all().items()
        for title, expr in panel_queries(doc)
    ]


def _firing(prom: str, name: str) -> list[dict[str, Any]]:
    alerts = httpx.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def _fatal_alerts(prom: str) -> list[dict[str, Any]]:
    return _firing(prom, "FleetWatchGpuFatalVerdict")


def test_every_dashboard_query_returns_data_from_a_live_fleet(
    prepared_db: tuple[str, dict[str, str]],
    prometheus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_tool("prometheus")
    # The fleet below replays 90 days of history; the server takes 30 by default, keeps 14.
    monkeypatch.setenv("FLEETWATCH_SERVER_MAX_PAST_AGE_S", str(91 * 86400))
    monkeypatch.setenv("FLEETWATCH_SERVER_RAW_RETENTION_DAYS", "91")
    url, tokens = prepared_db
    spec_dir = tmp_path / "sim"
    fleetwatch("sim", "init", "--nodes", "3", "--gpus", "2", "--speed", "14400",
               "--horizon-days", "90", "--out", str(spec_dir))  # fmt: skip
    with live_server(url, tmp_path) as server:
        agents = [
            start_agent(f"sim-node-{i:03d}", server.url, tokens["agent"], tmp_path / "agents",
                        "--collectors", "sim", "--sim-spec", str(spec_dir / "fleet.json"))
            for i in range(3)
        ]  # fmt: skip
        try:
            with server.client(tokens["agent"]) as agent:
                pushed = agent.post("/v1/ingest", json=_node_batch(0, xid=True))
                assert pushed.status_code == 200, pushed.text
                start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=120)
                posted = agent.post(f"/v1/jobs/{JOB}/steps", json={"steps": _steps(start)})
                assert posted.status_code == 200, posted.text
                target = server.url.removeprefix("http://")
                prom = prometheus(_prometheus_config(tmp_path, target, tokens["read"]))
                queries = _dashboard_queries()
                empty: list[tuple[str, str]] = queries
                deadline = time.monotonic() + 90
                tick = 1
                while time.monotonic() < deadline:
                    agent.post("/v1/ingest", json=_node_batch(tick, xid=False))
                    tick += 1
                    empty = [(t, q) for t, q in queries if not _query(prom, q)]
                    if not empty and _fatal_alerts(prom) and _firing(prom, "FleetWatchPortDown"):
                        break
                    time.sleep(1.0)
            names = httpx.get(f"{prom}/api/v1/label/__name__/values", timeout=10).json()["data"]
            fatal = _fatal_alerts(prom)
            port_down = _firing(prom, "FleetWatchPortDown")
            ports = _query(prom, "count by (node, device) (fleetwatch_port_state)")
            shard_targets = _query(prom, 'up{job="fleetwatch-shards"}')
            gpus_per_node = _query(prom, "count by (node, gpu) (fleetwatch_gpu_info)")
        finally:
            logs = stop_agents(agents)
    assert not empty, f"{len(empty)} of {len(queries)} queries returned nothing: {empty}"
    # The shipped relabeling: 16 targets, ?shard=0..15, each GPU scraped from one of them only.
    assert sorted(int(t["metric"]["shard"]) for t in shard_targets) == list(range(16))
    assert all(t["value"][1] == "1" for t in shard_targets), shard_targets
    assert gpus_per_node and all(g["value"][1] == "1" for g in gpus_per_node), gpus_per_node
    used = {m for _, q in queries for m in re.findall(r"\bfleetwatch_[a-z0-9_]+", q)}
    assert used - set(names) == set(), "dashboards query metrics Prometheus never scraped"
    assert {(a["labels"]["node"], a["labels"]["gpu"]) for a in fatal} == {(NODE, GPU)}, fatal
    assert all(a["labels"]["severity"] == "critical" and "79" in a["labels"]["rule"] for a in fatal)
    # The fabric: the down port pages for its node; each port is scraped from one shard only.
    assert [(a["labels"]["node"], a["labels"]["severity"]) for a in port_down] == [
        (NODE, "critical")
    ], port_down
    assert sorted(p["metric"]["device"] for p in ports if p["metric"]["node"] == NODE) == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_bond_0"
    ], ports  # fmt: skip
    assert all(p["value"][1] == "1" for p in ports), ports
    assert all("Traceback" not in log for log in logs.values()), logs
