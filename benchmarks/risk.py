"""How fast the fleet is judged and ranked (default 10,000 GPUs).

Seeds N nodes x 8 GPUs (every canonical field, two samples each, a fatal Xid on 1 % of GPUs and
an application Xid on 10 % of nodes) into a fresh SQLite file, rolls up the telemetry, stores a
risk model fitted on synthetic lifetimes with telemetry covariates, then measures:

* in-process: one background assessment pass (rules over every GPU + covariates + model), cold
  and warm, and scoring every GPU for a new horizon;
* over loopback HTTP against the real server: ``GET /v1/risk`` p50/p99 for a horizon already
  scored (the common case), for a new horizon on every request (scores computed in the
  request), for ``scope=node``, and ``GET /healthz`` as the HTTP floor, side by side; then
  ``GET /metrics`` with the risk and verdict series, first and repeated.

    .venv/bin/python benchmarks/risk.py [--gpus 10000] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics import GPUS_PER_NODE, _sample, seed  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.models.registry import RiskBundle  # noqa: E402
from fleetwatch.models.telemetry_features import FEATURE_NAMES  # noqa: E402
from fleetwatch.rules.thresholds import HealthThresholds  # noqa: E402
from fleetwatch.rules.xid_catalog import XidCatalog  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.sample_blocks import encode_blocks  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.db.tables import gpu_sample_blocks  # noqa: E402
from fleetwatch.server.judge.assessor import Assessor  # noqa: E402
from fleetwatch.server.repo.models import store_model  # noqa: E402
from fleetwatch.server.repo.sample_reader import from_us, to_us  # noqa: E402
from fleetwatch.server.upkeep.rollups import RollupJob  # noqa: E402
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES  # noqa: E402


def _synthetic_bundle(n: int = 20_000, seed_: int = 3) -> RiskBundle:
    rng = np.random.default_rng(seed_)
    covariates = {name: rng.exponential(1.0, n) for name in FEATURE_NAMES}
    scale = 900.0 * np.exp(-0.3 * covariates["sbe_per_day"] - 0.2 * covariates["xid_memory"])
    life = scale * rng.weibull(1.3, n)
    censor = rng.uniform(100, 1500, n)
    frame = pd.DataFrame(
        {"duration_days": np.minimum(life, censor), "event": (life <= censor).astype(int),
         "group": "NVIDIA H100 80GB HBM3", **covariates}
    )  # fmt: skip
    return RiskBundle.fit(frame)


def store_samples(db: Database, n_nodes: int, now: datetime) -> None:
    """Two samples a GPU, 30 s apart, stored as the server stores a push (one block a GPU)."""
    count, keys, times, rows = n_nodes * GPUS_PER_NODE, [], [], []
    for tick, at in ((1, now - timedelta(seconds=30)), (2, now)):
        values = _sample(tick)
        keys += range(1, count + 1)  # the seed's GPU ids, in its order
        times += [to_us(at)] * count
        rows += [tuple(values.get(name) for name in SAMPLE_FIELD_NAMES)] * count
    with db.write() as conn:
        conn.execute(
            insert(gpu_sample_blocks),
            [{"gpu_id": b.gpu_key, "node_id": (b.gpu_key - 1) // GPUS_PER_NODE + 1,
              "ts0": from_us(b.ts0_us), "ts1": from_us(b.ts1_us), "n": b.n, "data": b.data}
             for b in encode_blocks(keys, times, rows)],
        )  # fmt: skip


def _timed(client: httpx.Client, path: str, params: dict[str, str]) -> float:
    started = time.perf_counter()
    client.get(path, params=params).raise_for_status()
    return time.perf_counter() - started


def _pcts(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.requests = 80, 2
    nodes = args.gpus // GPUS_PER_NODE
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/risk.db"
        db = Database(make_engine(ServerSettings(database_url=url)))
        upgrade(db.engine)
        print(f"seeding {nodes} nodes x {GPUS_PER_NODE} GPUs ...", file=sys.stderr)
        now = datetime.now(UTC)
        seed(db, nodes, fatal_every=100, ports_per_node=0, now=now)
        store_samples(db, nodes, now)
        catalog = XidCatalog.load()
        started = time.perf_counter()
        RollupJob(db, catalog)()
        print(f"rollups of {args.gpus} GPUs: {time.perf_counter() - started:.2f} s")
        started = time.perf_counter()
        lifetimes = 2_000 if args.smoke else 20_000
        bundle = _synthetic_bundle(lifetimes)
        print(f"fit of the model ({lifetimes:,} lifetimes, {len(FEATURE_NAMES)} covariates): "
              f"{time.perf_counter() - started:.2f} s")  # fmt: skip
        with db.write() as conn:
            store_model(conn, bundle, trigger="manual", trained_at=datetime.now(UTC))

        settings = ServerSettings(database_url=url, model_window_days=7)
        assessor = Assessor(db, settings, catalog, HealthThresholds())
        for label in ("cold", "warm"):
            started = time.perf_counter()
            snap = assessor.run_once()
            verdicts = sum(len(g.verdicts) for g in snap.gpus)
            print(f"assessment pass ({label}): {time.perf_counter() - started:.2f} s, "
                  f"{verdicts} verdicts on {len(snap.gpus)} GPUs")  # fmt: skip
        started = time.perf_counter()
        snap.risks(3.0)
        elapsed = time.perf_counter() - started
        print(f"scoring {len(snap.gpus)} GPUs for a new horizon: {elapsed:.3f} s")

        from fleetwatch.server.auth import create_token

        with db.write() as conn:
            token, _ = create_token(conn, name="bench", scope="read")
        port = 19000 + (int(time.time()) % 1000)
        env = {**os.environ, "FLEETWATCH_SERVER_ASSESS_INTERVAL_S": "3600",
               "FLEETWATCH_SERVER_REFIT_INTERVAL_S": "0"}  # fmt: skip
        server = subprocess.Popen(
            [sys.executable, "-m", "fleetwatch", "server", "--port", str(port),
             "--database-url", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                              headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            _timed(client, "/v1/risk", {"horizon": "24h"})  # first request builds the snapshot
            n = args.requests
            rows = {
                "GET /healthz (HTTP floor)": [_timed(client, "/healthz", {}) for _ in range(n)],
                "GET /v1/risk?horizon=24h&limit=50": [
                    _timed(client, "/v1/risk", {"horizon": "24h", "limit": "50"}) for _ in range(n)
                ],
                "GET /v1/risk?scope=node&limit=50": [
                    _timed(client, "/v1/risk", {"horizon": "24h", "scope": "node", "limit": "50"})
                    for _ in range(n)
                ],
                "GET /v1/risk, new horizon each time": [
                    _timed(client, "/v1/risk", {"horizon": f"{25 + i}h", "limit": "50"})
                    for i in range(min(n, 50))
                ],
            }
            for name, samples in rows.items():
                print(f"{name:40s} {_pcts(samples)}  ({len(samples)} requests)")
            # /metrics with the risk and verdict series of this snapshot: the first scrape
            # renders them, later ones reuse the text until the next assessment.
            for label in ("first", "repeat", "repeat"):
                started = time.perf_counter()
                page = client.get("/metrics")
                page.raise_for_status()
                elapsed = time.perf_counter() - started
                # Per node on the default page; the per-GPU series are on the shards.
                lines = page.text.count("fleetwatch_node_failure_probability{")
                print(f"GET /metrics ({label}): {elapsed:.2f} s, {len(page.content) / 1e6:.1f} MB, "
                      f"{lines} node probability series")  # fmt: skip
        finally:
            client.close()
            server.terminate()
            server.wait(10)
            db.dispose()


if __name__ == "__main__":
    main()
