"""FleetWatch's own ``/metrics`` during the scale run: page size and scrape time, shard 3 of the
shard count the shipped scrape config recommends for the fleet's size (``?shard=3&shards=32`` at
100,000 GPUs, :func:`recommended_shards`) and, when that is not 16, shard 3 of 16 beside it, and
the background jobs' counters read off the page.

The scraper runs in a thread of the benchmark process, one scrape at a time (never two at once),
reading the body as it streams (a 100,000-GPU page is hundreds of megabytes; only its first
megabytes are kept: the process registry, where the background job metrics are, comes first).

Background pass times: the server exposes ``fleetwatch_background_runs_total{job}``; any family
named ``fleetwatch_background_*seconds*`` with a ``job`` label is read as the pass time (a
histogram or summary: the mean of the passes between two scrapes; a gauge: the last pass). A job
without one is reported as "not exposed", never estimated.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx

__all__ = ["MetricsScraper", "background_jobs", "group_commit", "recommended_shards", "scrape"]

# What dashboards/prometheus/prometheus.yml tells operators: a shard near 3,000 GPUs, 16 shards up
# to about 50,000 GPUs, 32 at 100,000.
GPUS_PER_SHARD = 3_200


def recommended_shards(gpus: int) -> int:
    """The smallest power of two that keeps a shard at or under :data:`GPUS_PER_SHARD` GPUs."""
    shards = 1
    while gpus > shards * GPUS_PER_SHARD:
        shards *= 2
    return shards


_HEAD_BYTES = 4 * 2**20
_LINE = re.compile(r"^(fleetwatch_background_\w+)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_RENDER = re.compile(
    r'^fleetwatch_metrics_render_(seconds_sum|cpu_seconds_total)\{page="default"\}\s+(\S+)',
    re.MULTILINE,
)

_GROUP = re.compile(
    r"^fleetwatch_ingest_group_(batches_sum|batches_count|left_out_total)\s+(\S+)", re.MULTILINE
)

Series = dict[tuple[str, str], float]  # (metric name, job) -> value


def scrape(url: str, token: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``GET /metrics``, uncompressed, timed until the last byte."""
    headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}
    started = time.perf_counter()
    size, head = 0, bytearray()
    try:
        with httpx.stream(
            "GET", f"{url}/metrics", params=params, headers=headers, timeout=600
        ) as answer:
            for chunk in answer.iter_raw():
                size += len(chunk)
                if len(head) < _HEAD_BYTES:
                    head += chunk
            status = answer.status_code
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    seconds = time.perf_counter() - started
    return {"status": status, "bytes": size, "seconds": round(seconds, 3), "head": bytes(head)}


def background_series(head: bytes) -> Series:
    out: Series = {}
    for line in head.decode("utf-8", errors="replace").splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        if "job" in labels:
            try:
                out[(match.group(1), labels["job"])] = float(match.group(3))
            except ValueError:
                continue
    return out


def group_commit(urls: list[str], token: str) -> dict[str, Any]:
    """Pushes per group transaction, over the api processes' lives: each one's
    ``fleetwatch_ingest_group_batches`` sum and count (process-local, so every api is asked)."""
    totals = {"batches_sum": 0.0, "batches_count": 0.0, "left_out_total": 0.0}
    for url in urls:
        page = scrape(url, token)
        text = page.get("head", b"").decode("utf-8", errors="replace")
        for name, value in _GROUP.findall(text):
            totals[name] += float(value)
    groups = totals["batches_count"]
    return {
        "groups": int(groups),
        "pushes": int(totals["batches_sum"]),
        "left_out": int(totals["left_out_total"]),
        "pushes_per_group": round(totals["batches_sum"] / groups, 1) if groups else None,
    }


def render_totals(head: bytes) -> dict[str, float]:
    """The server's own totals for the default pages it built before this one: wall seconds
    (``seconds_sum``) and its threads' CPU (``cpu_seconds_total``)."""
    text = head.decode("utf-8", errors="replace")
    return {name: float(value) for name, value in _RENDER.findall(text)}


def server_side_times(pages: list[dict[str, Any]]) -> None:
    """Each default-page scrape's server-side build time and CPU, read from the totals on the
    next scrape's page (only this scraper asks for the default page, so the difference is one
    build); the last scrape has none."""
    for page, after in zip(pages, pages[1:], strict=False):
        before_totals, after_totals = page.get("render_totals"), after.get("render_totals")
        if before_totals is None or not after_totals:  # {}: no page built before this one
            continue
        for key, name in (("seconds_sum", "server_s"), ("cpu_seconds_total", "server_cpu_s")):
            if key in after_totals:
                page[name] = round(after_totals[key] - before_totals.get(key, 0.0), 3)


def background_jobs(first: Series, last: Series) -> dict[str, dict[str, Any]]:
    """Per job: passes completed between two scrapes, and the pass time where one is exposed."""
    jobs: dict[str, dict[str, Any]] = {}
    for (name, job), value in last.items():
        info = jobs.setdefault(job, {"runs": None, "pass_s": None, "pass_source": None})
        if name == "fleetwatch_background_runs_total":
            info["runs"] = round(value - first.get((name, job), 0.0))
    for (name, job), value in last.items():
        info = jobs[job]
        if "seconds" not in name or name.endswith(("_count", "_bucket", "_created")):
            continue
        if name.endswith("_sum"):
            count_key = (name[: -len("_sum")] + "_count", job)
            passes = last.get(count_key, 0.0) - first.get(count_key, 0.0)
            if passes > 0:
                info["pass_s"] = (value - first.get((name, job), 0.0)) / passes
                info["pass_source"] = f"mean of {passes:.0f} passes, {name[: -len('_sum')]}"
        elif info["pass_s"] is None:
            info["pass_s"] = value
            info["pass_source"] = f"last pass, {name}"
    return jobs


def _shard_index(count: int) -> int:
    """Shard 3, or a small fleet's last one (it may have only one or two)."""
    return min(3, count - 1)


class MetricsScraper(threading.Thread):
    """Scrapes ``/metrics`` at ``start + first_s``, then every ``every_s`` until ``end``; each
    time also shard 3 of ``shards`` (and of 16 when ``shards`` is not 16), unless the server
    refused it once."""

    def __init__(
        self,
        url: str,
        token: str,
        start: float,
        end: float,
        first_s: float,
        every_s: float,
        shards: int = 16,
    ) -> None:
        super().__init__(name="metrics-scraper", daemon=True)
        self.url, self.token = url, token
        self.start_at, self.end, self.first_s, self.every_s = start, end, first_s, every_s
        self.shard_count = shards
        self.pages: list[dict[str, Any]] = []
        self.shards: list[dict[str, Any]] = []
        self.shards_of_16: list[dict[str, Any]] = []
        self.shard_reason: str | None = None
        self.series: list[Series] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        k = 0
        while not self._stop_event.is_set():
            at = self.start_at + self.first_s + k * self.every_s
            if k > 0 and at > self.end - 10:
                return
            if self._stop_event.wait(max(0.0, at - time.monotonic())):
                return
            self.scrape_once(f"{k}")
            k += 1

    def scrape_once(self, label: str) -> None:
        at = time.monotonic() - self.start_at
        page = scrape(self.url, self.token)
        head = page.pop("head", b"")
        self.pages.append({"at_s": round(at, 1), "label": label, **page})
        if page.get("status") == 200:
            self.pages[-1]["render_totals"] = render_totals(head)
            self.series.append(background_series(head))
            if self.shard_reason is None:
                self._scrape_shard()

    def _scrape_shard(self) -> None:
        counts = [(self.shard_count, self.shards)]
        if self.shard_count != 16:
            counts.append((16, self.shards_of_16))
        for count, scraped in counts:
            params = {"shard": str(_shard_index(count)), "shards": str(count)}
            shard = scrape(self.url, self.token, params)
            shard.pop("head", None)
            if shard.get("status") != 200:
                self.shard_reason = f"answered {shard.get('status') or shard.get('error')}"
                return
            scraped.append(shard)

    def stop(self) -> None:
        self._stop_event.set()

    def summary(self) -> dict[str, Any]:
        shard: dict[str, Any] = {
            "available": bool(self.shards),
            "reason": self.shard_reason,
            "shards": self.shard_count,
            "shard": _shard_index(self.shard_count),
        }
        if self.shards:
            shard.update(_worst(self.shards))
        elif self.shard_reason is None:
            shard["reason"] = "not scraped"
        if self.shards_of_16:
            shard["of_16"] = _worst(self.shards_of_16)
        # Passes between the first and the last scrape; with one scrape, since the server started.
        first = self.series[0] if len(self.series) > 1 else {}
        jobs = background_jobs(first, self.series[-1]) if self.series else {}
        server_side_times(self.pages)
        return {"page": self.pages, "shard": shard, "background": jobs}


def _worst(scrapes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "max_s": max(s["seconds"] for s in scrapes),
        "bytes": max(s["bytes"] for s in scrapes),
        "scrapes": len(scrapes),
    }
