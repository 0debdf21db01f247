"""What the fleet page and a node page cost at fleet scale (default 100,000 GPUs).

Seeds N/8 nodes x 8 GPUs into a fresh SQLite file (``metrics.py``'s fleet: rack and row labels,
a fatal Xid on 1 % of GPUs, a stored risk model), 30 days of drains, returns and GPU failures,
and a maintenance window; judges the fleet once (the background assessment, timed); then times,
in-process through the app (``TestClient``, so the HTTP floor is not counted):

* ``GET /`` (the whole page: tables, map, trends, risk distribution), median of ``--requests``;
* the pictures alone (:func:`fleetwatch.server.fleet_pictures.draw`: the map, the 30 days'
  outages and availability, the risk bands);
* ``GET /nodes/<name>`` for a node with a fatal Xid;

and the sizes of the page and its SVGs.

    .venv/bin/python benchmarks/fleet_page.py [--gpus 100000] [--requests 5] [--smoke]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fastapi.testclient import TestClient  # noqa: E402
from metrics import GPUS_PER_NODE, node_name, seed, store_risk_model  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.app import create_app  # noqa: E402
from fleetwatch.server.auth import create_token  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import Database, make_engine  # noqa: E402
from fleetwatch.server.db.tables import evictions, gpu_lifetimes, maintenance_windows  # noqa: E402
from fleetwatch.server.fleet_pictures import draw, node_flags  # noqa: E402
from fleetwatch.server.page import _racks  # noqa: E402


def seed_history(db: Database, n_nodes: int, now: datetime) -> None:
    """A drain a day per 500 nodes (returned 6 h later, the last day's still out), a GPU
    failure a day per 1,000 nodes, and one maintenance window over the first rack."""
    drains, failures = [], []
    for day in range(30):
        at = now - timedelta(days=30 - day)
        for k in range(max(1, n_nodes // 500)):
            node = node_name((day * 97 + k * 13) % n_nodes)
            back = at + timedelta(hours=6) if day < 29 else None
            drains.append({
                "node": node, "state": "returned" if back else "completed",
                "reason_kind": "rule", "reason": "bench", "dry_run": False, "created_at": at,
                "updated_at": at, "completed_at": at, "returned_at": back,
            })  # fmt: skip
        for k in range(max(1, n_nodes // 1000)):
            n = (day * 31 + k * 7) % n_nodes
            failures.append({
                "serial": f"failed-{day}-{k}", "node_id": n + 1, "location": f"{node_name(n)}/0",
                "sku": "NVIDIA H100 80GB HBM3", "installed_at": now - timedelta(days=300),
                "removed_at": at, "end_kind": "failure", "source": "observed",
            })  # fmt: skip
    with db.write() as conn:
        conn.execute(insert(evictions), drains)
        conn.execute(insert(gpu_lifetimes), failures)
        conn.execute(insert(maintenance_windows).values(
            nodes=None, selector={"rack": "r0"}, starts_at=now - timedelta(hours=1),
            ends_at=now + timedelta(hours=1), reason="bench", created_by="bench", created_at=now,
        ))  # fmt: skip


def _median_s(client: TestClient, path: str, n: int) -> tuple[float, str]:
    times, body = [], ""
    for _ in range(n):
        started = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text[:500]
        body = response.text
    return statistics.median(times), body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.requests = 160, 1
    n_nodes = args.gpus // GPUS_PER_NODE
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/page.db"
        db = Database(make_engine(ServerSettings(database_url=url, _env_file=None)))  # type: ignore[call-arg]
        upgrade(db.engine)
        now = datetime.now(UTC)
        print(f"seeding {n_nodes} nodes x {GPUS_PER_NODE} GPUs ...", file=sys.stderr)
        seed(db, n_nodes, fatal_every=100, ports_per_node=0, now=now)
        seed_history(db, n_nodes, now)
        store_risk_model(db)
        with db.write() as conn:
            token, _ = create_token(conn, name="bench", scope="read")
        db.engine.dispose()
        settings = ServerSettings(  # type: ignore[call-arg]
            database_url=url, background_jobs=False, metrics_cache_ttl_s=0, _env_file=None
        )
        with TestClient(
            create_app(settings), headers={"Authorization": f"Bearer {token}"}
        ) as client:
            app = client.app
            started = time.perf_counter()
            snap = app.state.assessor.run_once()  # type: ignore[attr-defined]
            print(f"assessment pass: {time.perf_counter() - started:.2f} s, {len(snap.gpus)} GPUs")
            first, _ = _median_s(client, "/", 1)
            page_s, html = _median_s(client, "/", args.requests)
            svgs = re.findall(r"<svg .*?</svg>", html, re.DOTALL)
            level = "per-rack" if "fleet-map per-rack" in html else "per-node"
            tiles = html.count('class="tile ')
            print(f"GET / first: {first:.3f} s; median of {args.requests}: {page_s:.3f} s; "
                  f"{len(html) / 1e3:.0f} kB, SVG {sum(map(len, svgs)) / 1e3:.0f} kB "
                  f"(map {level}, {tiles} tiles)")  # fmt: skip
            times = []
            liveness = app.state.liveness  # type: ignore[attr-defined]
            for _ in range(args.requests):
                started = time.perf_counter()
                flags = node_flags(snap, 1.0, settings.notice_risk_threshold)
                with app.state.db.read() as conn:  # type: ignore[attr-defined]
                    _, readings = _racks(conn, liveness.clock(), liveness)
                    draw(conn, readings, flags=flags, draining=set(), now=liveness.clock(),
                         sla_target=settings.sla_availability)  # fmt: skip
                times.append(time.perf_counter() - started)
            print(f"pictures alone (node states, map, 30 days' trends, risk bands): "
                  f"median {statistics.median(times):.3f} s")  # fmt: skip
            node_s, node_html = _median_s(client, f"/nodes/{node_name(0)}", args.requests)
            print(
                f"GET /nodes/{node_name(0)}: median {node_s:.3f} s, {len(node_html) / 1e3:.0f} kB"
            )


if __name__ == "__main__":
    main()
