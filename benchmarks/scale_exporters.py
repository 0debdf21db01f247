"""dcgm-exporter pages for Prometheus: the simulated fleet's values as ``/metrics`` text.

A real fleet runs one dcgm-exporter per node. Here one process stands in for all of them and
serves ``targets`` pages; page ``k`` (``/metrics/k``) carries the GPUs of ``nodes_per_target``
consecutive nodes, each series labelled as dcgm-exporter labels it (``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` = the node, ``DCGM_FI_DRIVER_VERSION``),
grouped by metric family with ``# HELP`` and ``# TYPE`` as dcgm-exporter writes them. Prometheus
stores the same series as with one exporter per node; it makes ``nodes_per_target`` times fewer
requests (and keeps that many times fewer ``up``/``scrape_*`` series), which, if anything,
flatters Prometheus.

The pages are rendered before the run, one per tick variant (``scale_fleet``), and kept
gzip-compressed (Prometheus asks for gzip); the page served is the current tick's:
``int((time - epoch) / tick) % variants``. Serving pre-built bytes costs the machine almost
nothing, so Prometheus' CPU is Prometheus' own.

Run: ``python benchmarks/scale_exporters.py --nodes N --gpus-per-node 8 --seed S --tick 10
--nodes-per-target 10 --epoch E --port P``; it prints ``ready <port> <targets>`` once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import sys
import time
from typing import Any

from scale_fleet import Fleet, Gpu, PushRenderer, format_ts

from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter
from fleetwatch.telemetry import SAMPLE_FIELDS, Batch

__all__ = ["ExporterPages", "disagreements", "render_page"]


def _labels(gpu: Gpu) -> str:
    domain, rest = gpu.pci_bus_id.split(":", 1)
    return (
        f'{{gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="0000{domain.upper()}:{rest.upper()}",'
        f'device="nvidia{gpu.index}",modelName="NVIDIA H100 80GB HBM3",Hostname="{gpu.node}",'
        f'DCGM_FI_DRIVER_VERSION="550.90.07"}}'
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def render_page(fleet: Fleet, nodes: range, variant: int) -> bytes:
    """The page of ``nodes`` at tick ``variant``: every field of every GPU, as dcgm-exporter."""
    gpus = [g for i in nodes for g in fleet.gpus(i)]
    labels = [_labels(g) for g in gpus]
    values = [fleet.values(g, variant) for g in gpus]
    out: list[str] = []
    for spec in SAMPLE_FIELDS:
        name = spec.dcgm
        kind = "counter" if spec.kind == "counter" else "gauge"
        out.append(f"# HELP {name} {spec.help}.\n# TYPE {name} {kind}\n")
        out.extend(
            f"{name}{lab} {_text(v[spec.name])}\n" for lab, v in zip(labels, values, strict=True)
        )
    return "".join(out).encode()


def disagreements(fleet: Fleet, nodes: range, variant: int = 2) -> list[str]:
    """Where a page and the agents' pushes of the same ticks differ: the page read back by
    FleetWatch's own dcgm-exporter parser, the pushes by the wire schema. Empty: the same
    values, every field, every GPU."""
    paged = {
        r.identity.get("uuid"): r.values
        for r in parse_dcgm_exporter(render_page(fleet, nodes, variant).decode())
    }
    out: list[str] = []
    for i in nodes:
        renderer = PushRenderer(fleet, i, fleet.tick_s)
        body = renderer.render("check", [(variant, format_ts(time.time()))])
        for sample in Batch.model_validate_json(body).samples:
            pushed, page = sample.values(), paged.get(sample.uuid, {})
            for name in sorted(pushed.keys() | page.keys()):
                if pushed.get(name) != page.get(name):
                    shown = f"pushed {pushed.get(name)!r}, page {page.get(name)!r}"
                    out.append(f"{sample.uuid} {name}: {shown}")
    return out


class ExporterPages:
    """Every target's page at every variant, gzip-compressed."""

    def __init__(self, fleet: Fleet, nodes_per_target: int, epoch: float) -> None:
        self.fleet, self.epoch = fleet, epoch
        self.targets = -(-fleet.nodes // nodes_per_target)
        self.pages: list[list[bytes]] = []
        self.gpus: list[int] = []  # per target
        self.raw_bytes = 0
        self.served_rows = 0  # GPU rows in the pages answered so far
        for k in range(self.targets):
            nodes = range(k * nodes_per_target, min(fleet.nodes, (k + 1) * nodes_per_target))
            self.gpus.append(len(nodes) * fleet.gpus_per_node)
            variants = []
            for v in range(fleet.variants):
                raw = render_page(fleet, nodes, v)
                self.raw_bytes += len(raw)
                # Level 1: built once; what Prometheus pays to inflate it hardly depends on it.
                variants.append(gzip.compress(raw, compresslevel=1))
            self.pages.append(variants)

    def current(self, target: int) -> bytes:
        variant = int((time.time() - self.epoch) / self.fleet.tick_s) % self.fleet.variants
        return self.pages[target][variant]


async def _serve_connection(
    pages: ExporterPages, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """HTTP/1.1 keep-alive: ``GET /metrics/<k>`` (plain text to clients that do not take gzip)
    and ``GET /served``, the GPU rows in the pages answered so far."""
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            path = head.split(" ", 2)[1]
            if path == "/served":
                text = str(pages.served_rows).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
                continue
            gzip_ok = "gzip" in head.lower().split("accept-encoding:", 1)[-1].split("\r\n", 1)[0]
            try:
                target = int(path.rsplit("/", 1)[1])
                body = pages.current(target)
            except (ValueError, IndexError):
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            encoding = b"Content-Encoding: gzip\r\n" if gzip_ok else b""
            if not gzip_ok:
                body = gzip.decompress(body)
            writer.writelines(
                (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n",
                    encoding,
                    b"Content-Length: %d\r\n\r\n" % len(body),
                    body,
                )
            )
            await writer.drain()
            pages.served_rows += pages.gpus[target]
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(pages: ExporterPages, port: int) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(pages, r, w), "127.0.0.1", port
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"ready {bound} {pages.targets} {pages.raw_bytes}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="dcgm-exporter pages of the simulated fleet")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--tick", type=float, default=10.0)
    p.add_argument("--variants", type=int, default=6)
    p.add_argument("--nodes-per-target", type=int, default=10)
    p.add_argument("--epoch", type=float, required=True, help="wall time of tick 0")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    fleet = Fleet(
        args.nodes, args.gpus_per_node, seed=args.seed, tick_s=args.tick, variants=args.variants
    )
    pages = ExporterPages(fleet, args.nodes_per_target, args.epoch)
    try:
        asyncio.run(serve(pages, args.port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
