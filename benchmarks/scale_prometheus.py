"""Prometheus beside FleetWatch: the real ``prometheus`` binary scraping the dcgm-exporter pages.

:func:`write_config` points one job at every page of ``scale_exporters.py`` (``/metrics/<k>``, one
target each, ``instance="exporter-<k>"``), every 10 s by default. :class:`Prometheus` runs the
binary on a temporary TSDB directory with the admin API on (for the snapshot) and answers what
the benchmark compares:

- GPU rows stored in a window: ``sum(count_over_time(DCGM_FI_DEV_GPU_TEMP[w]))``, one sample of
  that series per GPU per scrape, exactly as FleetWatch stores one row per GPU per tick;
- its CPU (utime + stime from /proc) and peak RSS (VmHWM);
- disk: the TSDB directory as it is (write-ahead log plus head chunks: a 10-minute run never
  leaves the 2-hour head block) and the block a snapshot writes from the head
  (``POST /api/v1/admin/tsdb/snapshot``), i.e. what the same samples take once compacted.

:func:`start_prometheus_side` starts the exporter pages and Prometheus for a run;
:func:`prometheus_figures` collects the figures after it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from procstats import proc_cpu_s, rss_peak_bytes
from scale_parties import Child, child, log
from serverproc import free_port

__all__ = [
    "Prometheus",
    "PrometheusSide",
    "disk_bytes",
    "prometheus_figures",
    "start_prometheus_side",
    "write_config",
]

HERE = Path(__file__).resolve().parent

GPU_ROW_SERIES = "DCGM_FI_DEV_GPU_TEMP"


def write_config(path: Path, exporter_port: int, targets: int, scrape_interval_s: float) -> Path:
    """prometheus.yml (JSON is YAML) for the exporter pages."""
    config = {
        "global": {
            "scrape_interval": f"{scrape_interval_s:g}s",
            "scrape_timeout": f"{scrape_interval_s:g}s",
            "evaluation_interval": "1m",
        },
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{exporter_port}"],
                        "labels": {
                            "__metrics_path__": f"/metrics/{k}",
                            "instance": f"exporter-{k}",
                        },
                    }
                    for k in range(targets)
                ],
            }
        ],
    }
    path.write_text(json.dumps(config, indent=1))
    return path


def disk_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (st_blocks, as du counts them)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


class Prometheus:
    """One ``prometheus`` process on a TSDB directory of its own."""

    def __init__(self, binary: str, config: Path, data_dir: Path, log_path: Path) -> None:
        self.data_dir = data_dir
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data_dir}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-admin-api",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # On a shared machine running short of memory, the kernel should kill this one first
        # (it is the largest anyway), not somebody else's work.
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.process.pid}/oom_score_adj").write_text("1000")
        self.log_path = log_path
        self._client = httpx.Client(base_url=self.url, timeout=300)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"prometheus exited:\n{self.log_path.read_text()}")
            try:
                if self._client.get("/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        log = self.log_path.read_text()
        raise SystemExit(f"prometheus not ready after {timeout_s:g} s:\n{log}")

    def cpu_s(self) -> float:
        return proc_cpu_s(self.process.pid)

    def rss_peak_bytes(self) -> int:
        return rss_peak_bytes(self.process.pid)

    def query(self, expr: str, at: float) -> float | None:
        """The single value of an instant query at wall time ``at`` (None: empty result)."""
        answer = self._client.get("/api/v1/query", params={"query": expr, "time": f"{at:.3f}"})
        body: dict[str, Any] = answer.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r} failed: {body}")
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def gpu_rows(self, start_wall: float, end_wall: float) -> int:
        """GPU rows stored with timestamps in (start, end]."""
        window = max(1, round(end_wall - start_wall))
        value = self.query(f"sum(count_over_time({GPU_ROW_SERIES}[{window}s]))", end_wall)
        return int(value or 0)

    def scrape_health(self, start_wall: float, end_wall: float) -> dict[str, Any]:
        """Scrapes attempted and failed in the window, and the slowest scrape."""
        w = f"[{max(1, round(end_wall - start_wall))}s]"
        attempted = self.query(f"sum(count_over_time(up{w}))", end_wall) or 0.0
        succeeded = self.query(f"sum(sum_over_time(up{w}))", end_wall) or 0.0
        slowest = self.query(f"max(max_over_time(scrape_duration_seconds{w}))", end_wall)
        mean = self.query(f"avg(avg_over_time(scrape_duration_seconds{w}))", end_wall)
        return {
            "scrapes": int(attempted),
            "failed_scrapes": int(attempted - succeeded),
            "scrape_duration_max_s": slowest,
            "scrape_duration_mean_s": mean,
        }

    def head_series(self) -> int:
        answer = self._client.get("/api/v1/status/tsdb")
        answer.raise_for_status()
        return int(answer.json()["data"]["headStats"]["numSeries"])

    def snapshot(self) -> dict[str, int]:
        """Bytes of the block a snapshot writes from the head (the compacted samples): in all,
        its chunks (the samples) and its index (the series and postings)."""
        answer = self._client.post("/api/v1/admin/tsdb/snapshot", params={"skip_head": "false"})
        answer.raise_for_status()
        folder = self.data_dir / "snapshots" / answer.json()["data"]["name"]
        return {
            "bytes": disk_bytes(folder),
            "chunks_bytes": sum(disk_bytes(block / "chunks") for block in folder.iterdir()),
            "index_bytes": sum(
                (block / "index").stat().st_blocks * 512
                for block in folder.iterdir()
                if (block / "index").exists()
            ),
        }

    def stop(self) -> None:
        self._client.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its data is thrown away: no need to wait for a flush
            self.process.kill()
            self.process.wait()


@dataclass
class PrometheusSide:
    exporters: Child
    prometheus: Prometheus
    targets: int
    page_bytes: int  # all pages, every variant, uncompressed
    started_wall: float
    exporter_url: str
    gpus: int

    def served_rows(self) -> int | None:
        """GPU rows in the pages the exporter answered so far (None: it is gone)."""
        try:
            return int(httpx.get(f"{self.exporter_url}/served", timeout=10).text)
        except (httpx.HTTPError, ValueError):
            return None


def start_prometheus_side(
    args: argparse.Namespace, binary: str, workdir: Path, stack: contextlib.ExitStack
) -> PrometheusSide:
    log("dcgm-exporter pages: rendering")
    command = [sys.executable, str(HERE / "scale_exporters.py"), "--epoch", str(time.time())]
    for flag, value in (
        ("--nodes", args.prometheus_nodes or args.nodes),
        ("--gpus-per-node", args.gpus_per_node),
        ("--seed", args.seed),
        ("--tick", args.tick),
        ("--nodes-per-target", args.nodes_per_target),
    ):
        command += [flag, str(value)]
    exporters = stack.enter_context(child(command, workdir / "exporters.log"))
    _, port, targets, page_bytes = exporters.next_line(timeout_s=1800).split()
    log(f"dcgm-exporter pages: {targets} targets on port {port}, {int(page_bytes) / 1e6:,.0f} MB")
    config = write_config(workdir / "prometheus.yml", int(port), int(targets), args.tick)
    prom = Prometheus(binary, config, workdir / "tsdb", workdir / "prometheus.log")
    stack.callback(prom.stop)
    prom.wait_ready()
    log(f"prometheus up at {prom.url}")
    gpus = (args.prometheus_nodes or args.nodes) * args.gpus_per_node
    return PrometheusSide(
        exporters=exporters,
        prometheus=prom,
        targets=int(targets),
        page_bytes=int(page_bytes),
        started_wall=time.time(),
        exporter_url=f"http://127.0.0.1:{port}",
        gpus=gpus,
    )


def prometheus_figures(side: PrometheusSide, binary: str, window: dict[str, Any]) -> dict[str, Any]:
    """``{"prometheus": figures}``, or ``{"prometheus_error": why}`` when Prometheus could not
    answer (killed for memory, say): the FleetWatch figures still stand."""
    try:
        return {"prometheus": _prometheus_figures(side, binary, window)}
    except (httpx.HTTPError, RuntimeError, OSError, KeyError) as exc:
        code = side.prometheus.process.poll()
        why = f"{type(exc).__name__}: {exc}" + (f"; exited {code}" if code is not None else "")
        log(f"Prometheus figures not measured: {why}")
        return {"prometheus_error": why}


def _prometheus_figures(
    side: PrometheusSide, binary: str, window: dict[str, Any]
) -> dict[str, Any]:
    prom = side.prometheus
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    figures: dict[str, Any] = {
        "version": (version.stdout or version.stderr).splitlines()[0],
        "targets": side.targets,
        "gpus": side.gpus,
        "page_bytes_all_variants": side.page_bytes,
        "rows_in_window": prom.gpu_rows(window["start_wall"], window["end_wall"]),
        "scrape_health": prom.scrape_health(window["start_wall"], window["end_wall"]),
        "rows_total": prom.gpu_rows(side.started_wall - 60, time.time()),
        "tsdb_bytes": disk_bytes(prom.data_dir),
        "rss_peak_bytes": prom.rss_peak_bytes(),
    }
    cpu_before, started = prom.cpu_s(), time.perf_counter()
    try:
        figures["head_series"] = prom.head_series()
        block = prom.snapshot()
        figures["snapshot_s"] = round(time.perf_counter() - started, 3)
        figures["snapshot_cpu_s"] = round(prom.cpu_s() - cpu_before, 3)
        figures.update({f"snapshot_{k}": v for k, v in block.items()})
    except Exception as exc:  # noqa: BLE001 - reported; the other figures still stand
        figures["snapshot_bytes"] = None
        figures["snapshot_error"] = f"{type(exc).__name__}: {exc}"
    log(
        f"Prometheus: {figures['rows_in_window']:,} GPU rows in the window, "
        f"{figures['rows_total']:,} in all; TSDB {figures['tsdb_bytes'] / 1e6:,.0f} MB, "
        f"block {(figures['snapshot_bytes'] or 0) / 1e6:,.0f} MB; peak RSS "
        f"{figures['rss_peak_bytes'] / 2**30:.2f} GiB"
    )
    return figures
