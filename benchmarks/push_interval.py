"""What pushing several collections at once saves: bytes per GPU row and requests per node.

1. Wire bytes, in-process (no network, an injected clock): the real agent code (collect, stage,
   combine, gzip as the spool stores it) for an 8-GPU node collecting every 10 s, pushing every
   10 s (one collection per batch) and every 60 s (six), over ``--collections`` collections.
   Every request goes to an ``httpx.MockTransport`` that answers 200 and records it: the gzip body
   bytes, and the request line and headers as httpx sends them (the agent's Authorization and
   User-Agent included). Two sources: the simulator (values that move from tick to tick) and the
   8 x H100 NVML fixture (the same values every tick: gzip's best case).
2. Requests, end to end: a real ``fleetwatch server`` (SQLite) and two real ``fleetwatch agent``
   processes (sim collector, 8 GPUs, ``--interval 10``), one with ``--push-interval 0`` and one
   with ``--push-interval 60``, for ``--minutes`` after a one-minute warm-up; the server's
   ``ingest_batches`` rows per node in that window give requests per minute per node.

    .venv/bin/python benchmarks/push_interval.py [--collections 60] [--minutes 5] [--skip-live]
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.live import create_token, fleetwatch, live_server, start_agent  # noqa: E402

from fleetwatch import __version__  # noqa: E402
from fleetwatch.agent.collectors.base import Collector  # noqa: E402
from fleetwatch.agent.collectors.nvml import NvmlCollector  # noqa: E402
from fleetwatch.agent.collectors.sim import SimCollector  # noqa: E402
from fleetwatch.agent.loop import Agent  # noqa: E402
from fleetwatch.agent.nvml import Nvml  # noqa: E402
from fleetwatch.agent.push import Pusher  # noqa: E402
from fleetwatch.agent.selfmetrics import AgentMetrics  # noqa: E402
from fleetwatch.agent.spool import Spool  # noqa: E402
from fleetwatch.sim.spec import FleetSpec  # noqa: E402
from fleetwatch.telemetry import NodeInfo  # noqa: E402
from fleetwatch.testing import FakePynvml  # noqa: E402

INTERVAL_S = 10.0
TOKEN = "x" * 43  # as long as a real agent token (token_urlsafe(32))


class _Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def _sim_collector(start: datetime) -> Collector:
    spec = FleetSpec.live(seed=7, real_start=start, nodes=1, gpus_per_node=8)
    return SimCollector(spec, spec.node_name(0))


def _nvml_collector(start: datetime) -> Collector:
    fake = FakePynvml.from_json(REPO / "tests/fixtures/nvml/h100_8x.json")
    return NvmlCollector(Nvml(lib=fake))


def wire_bytes(source: str, push_interval_s: float, collections: int) -> dict[str, float]:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    clock = _Clock(start)
    collector = (_sim_collector if source == "sim" else _nvml_collector)(start)
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"accepted": {}, "duplicate": False})

    client = httpx.Client(
        transport=httpx.MockTransport(answer),
        base_url="https://fleetwatch.example.com:8400",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "User-Agent": f"fleetwatch-agent/{__version__}",
        },
    )
    with tempfile.TemporaryDirectory() as tmp:
        spool = Spool(Path(tmp))
        metrics = AgentMetrics()
        agent = Agent(
            node=NodeInfo(name="gpu-node-017", interval_s=INTERVAL_S, labels={"rack": "r12"}),
            collectors=[collector],
            spool=spool,
            pusher=Pusher(client, spool, metrics, rejected_dir=Path(tmp) / "rejected"),
            metrics=metrics,
            clock=clock,
            push_interval_s=push_interval_s,
        )
        for _ in range(collections):
            agent.cycle()
            agent.drain_once()
            clock.now += timedelta(seconds=INTERVAL_S)
        spool.close()
    collector.close()
    bodies = [len(r.content) for r in sent]
    heads = [
        len(f"{r.method} {r.url.raw_path.decode()} HTTP/1.1\r\n")
        + sum(len(k) + len(v) + 4 for k, v in r.headers.raw)
        + 2
        for r in sent
    ]
    batches = [json.loads(gzip.decompress(r.content)) for r in sent]
    samples = [sample for batch in batches for sample in batch["samples"]]
    rows = len(samples)
    plain = sum(len(gzip.decompress(r.content)) for r in sent)
    minutes = collections * INTERVAL_S / 60
    return {
        "requests": len(sent),
        "rows": rows,
        "fields_per_row": sum(len(sample) - 2 for sample in samples) / rows,
        "json_per_row": plain / rows,
        "body_per_row": sum(bodies) / rows,
        "wire_per_row": (sum(bodies) + sum(heads)) / rows,
        "head_per_request": sum(heads) / len(heads),
        "requests_per_min": len(sent) / minutes,
    }


def live_requests(minutes: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        url = f"sqlite:///{tmp / 'fleet.db'}"
        fleetwatch("db", "upgrade", "--database-url", url)
        fleetwatch("sim", "init", "--nodes", "2", "--gpus", "8", "--seed", "3", "--speed", "1",
                   "--out", str(tmp / "sim"))  # fmt: skip
        token = create_token(url, "agent")
        pushes = {"sim-node-000": 0.0, "sim-node-001": 60.0}
        with live_server(url, tmp) as server:
            agents = [
                start_agent(
                    name,
                    server.url,
                    token,
                    tmp / "agents",
                    "--collectors",
                    "sim",
                    "--sim-spec",
                    str(tmp / "sim" / "fleet.json"),
                    interval_s=INTERVAL_S,
                    push_interval_s=push,
                )  # fmt: skip
                for name, push in pushes.items()
            ]
            started = datetime.now(UTC)
            time.sleep(60 + minutes * 60 + 5)
            for agent in agents:
                agent.stop()
        window = (started + timedelta(seconds=60), started + timedelta(seconds=60 + minutes * 60))
        db = sqlite3.connect(tmp / "fleet.db")
        out = {}
        for name, push in pushes.items():
            received = [
                datetime.fromisoformat(row[0]).replace(tzinfo=UTC)
                for row in db.execute(
                    "SELECT b.received_at FROM ingest_batches b JOIN nodes n ON n.id = b.node_id"
                    " WHERE n.name = ?",
                    (name,),
                )
            ]
            inside = [t for t in received if window[0] <= t < window[1]]
            out[f"push {push:g} s"] = len(inside) / minutes
        db.close()
        return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collections", type=int, default=60)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.collections, args.skip_live = 12, True  # the live part: minutes of agents
    logging.basicConfig(level=logging.ERROR)  # the fixture's unsupported-field warnings
    print("| source | push interval | requests/min | rows | fields/row | JSON B/row "
          "| gzip body B/row | with headers B/row | headers B/request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for source in ("sim", "nvml-fixture"):
        for push in (INTERVAL_S, 60.0):
            r = wire_bytes(source, push, args.collections)
            print(f"| {source} | {push:g} s | {r['requests_per_min']:.1f} | {r['rows']:.0f} | "
                  f"{r['fields_per_row']:.1f} | {r['json_per_row']:.0f} | "
                  f"{r['body_per_row']:.1f} | {r['wire_per_row']:.1f} | "
                  f"{r['head_per_request']:.0f} |")  # fmt: skip
    if not args.skip_live:
        print(f"\nreal server, real agents, {args.minutes:g} min window: ingest requests per "
              "minute per node")  # fmt: skip
        for name, rate in live_requests(args.minutes).items():
            print(f"  {name}: {rate:.2f}")


if __name__ == "__main__":
    main()
