"""The fleet's /metrics: rendered from a cache of latest state, never from a scan of samples.

The cache follows the ``gpus``, ``nodes`` and ``events`` tables incrementally (rows whose
``last_seen`` / ``received_at`` moved past a watermark, with an overlap that catches transactions
committed out of order), so every replica and worker shows the whole fleet, not only what it
ingested itself. Each GPU's lines are formatted once per new sample and reused between scrapes.

Node liveness follows this process's :class:`~fleetwatch.server.judge.liveness.Liveness`, as the
alerter and the planner do. An *unheard* node (silent since before the server started, still in
its grace) has no ``fleetwatch_node_up`` sample: neither 1 nor 0 is known, and a 0 would start
the ``FleetWatchNodeUnreachable`` rule's clock on every restart. ``fleetwatch_nodes`` counts it
under ``state="unheard"``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from fleetwatch.metrics import GPU_METRICS, THROTTLE_REASONS
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpus, nodes
from fleetwatch.server.judge.liveness import Liveness, NodeReading

__all__ = ["FleetExposition", "escape_label"]

_OVERLAP = timedelta(seconds=30)
_GPU_FAMILIES = len(GPU_METRICS) + 3  # + info, last sample timestamp, per-reason throttle


def escape_label(value: str) -> str:
    """A Prometheus label value as the text format wants it (backslash, newline, quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any, scale: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if scale == 1.0 and isinstance(value, int):
        return str(value)
    return repr(float(value) * scale)


@dataclass
class _Node:
    name: str
    labels: dict[str, str]
    interval_s: float
    last_seen: datetime


@dataclass
class _Gpu:
    node_id: int
    index: int
    uuid: str
    model: str
    serial: str | None
    driver_version: str | None
    pci_bus_id: str | None
    latest_ts: datetime | None
    latest: dict[str, Any] | None
    lines: list[list[str]] | None = field(default=None)  # per family, rebuilt when stale


class FleetExposition:
    """Latest-state cache plus the text renderer for the fleet part of /metrics."""

    def __init__(
        self,
        db: Database,
        *,
        ttl_s: float,
        liveness: Liveness,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._liveness = liveness
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshed_at: float | None = None
        self._nodes: dict[int, _Node] = {}
        self._gpus: dict[str, _Gpu] = {}
        self._gpu_mark: datetime | None = None
        self._node_mark: datetime | None = None
        self._event_mark: datetime | None = None
        self._seen_events: dict[int, datetime] = {}
        self._xids: dict[tuple[int, str, int], int] = {}
        self._kinds: dict[tuple[int, str], int] = {}

    # -- cache ------------------------------------------------------------------------------

    def refresh(self, *, force: bool = False) -> None:
        with self._lock:
            fresh = self._refreshed_at is not None and (
                time.monotonic() - self._refreshed_at < self._ttl_s
            )
            if fresh and not force:
                return
            with self._db.read() as conn:
                self._load_nodes(conn)
                self._load_gpus(conn)
                self._load_events(conn)
            self._refreshed_at = time.monotonic()

    def _load_nodes(self, conn: Any) -> None:
        query = select(nodes)
        if self._node_mark is not None:
            query = query.where(nodes.c.last_seen >= self._node_mark - _OVERLAP)
        for row in conn.execute(query):
            self._nodes[row.id] = _Node(row.name, row.labels, row.interval_s, row.last_seen)
            if self._node_mark is None or row.last_seen > self._node_mark:
                self._node_mark = row.last_seen

    def _load_gpus(self, conn: Any) -> None:
        query = select(gpus)
        if self._gpu_mark is not None:
            query = query.where(gpus.c.last_seen >= self._gpu_mark - _OVERLAP)
        for row in conn.execute(query):
            old = self._gpus.get(row.uuid)
            unchanged = (
                old is not None and old.latest_ts == row.latest_ts and old.node_id == row.node_id
            )
            if not unchanged:
                self._gpus[row.uuid] = _Gpu(
                    node_id=row.node_id,
                    index=row.index,
                    uuid=row.uuid,
                    model=row.name or "",
                    serial=row.serial,
                    driver_version=row.driver_version,
                    pci_bus_id=row.pci_bus_id,
                    latest_ts=row.latest_ts,
                    latest=row.latest,
                )
            if self._gpu_mark is None or row.last_seen > self._gpu_mark:
                self._gpu_mark = row.last_seen

    def _load_events(self, conn: Any) -> None:
        if self._event_mark is None:
            self._count_all_events(conn)
        assert self._event_mark is not None
        since = self._event_mark - _OVERLAP
        rows = conn.execute(
            select(
                events.c.id,
                events.c.node_id,
                events.c.gpu_uuid,
                events.c.kind,
                events.c.xid,
                events.c.received_at,
            ).where(events.c.received_at >= since)
        )
        for row in rows:
            if row.id in self._seen_events:
                continue
            self._seen_events[row.id] = row.received_at
            self._count(row.node_id, row.gpu_uuid, row.kind, row.xid, 1)
            self._event_mark = max(self._event_mark, row.received_at)
        horizon = self._event_mark - 2 * _OVERLAP
        self._seen_events = {i: t for i, t in self._seen_events.items() if t >= horizon}

    def _count_all_events(self, conn: Any) -> None:
        """First load: aggregate what is already stored, then follow by watermark."""
        mark = conn.execute(select(func.max(events.c.received_at))).scalar() or self._clock()
        self._event_mark = mark
        since = mark - _OVERLAP
        grouped = conn.execute(
            select(
                events.c.node_id,
                events.c.gpu_uuid,
                events.c.kind,
                events.c.xid,
                func.count().label("n"),
            )
            .where(events.c.received_at < since)
            .group_by(events.c.node_id, events.c.gpu_uuid, events.c.kind, events.c.xid)
        )
        for row in grouped:
            self._count(row.node_id, row.gpu_uuid, row.kind, row.xid, row.n)

    def _count(
        self, node_id: int | None, uuid: str | None, kind: str, xid: int | None, n: int
    ) -> None:
        if node_id is None:
            return  # fleet-wide events (model wear-out) have no node label to count under
        key = (node_id, kind)
        self._kinds[key] = self._kinds.get(key, 0) + n
        if kind == "xid" and xid is not None:
            xkey = (node_id, uuid or "", xid)
            self._xids[xkey] = self._xids.get(xkey, 0) + n

    # -- rendering --------------------------------------------------------------------------

    def render(self) -> str:
        self.refresh()
        with self._lock:
            families: list[list[str]] = [[] for _ in range(_GPU_FAMILIES)]
            for gpu in self._gpus.values():
                node = self._nodes.get(gpu.node_id)
                if node is None:
                    continue
                if gpu.lines is None:
                    gpu.lines = self._gpu_lines(gpu, node.name)
                for bucket, lines in zip(families, gpu.lines, strict=True):
                    bucket.extend(lines)
            out: list[str] = []
            headers = [(m.name, m.type, m.help) for m in GPU_METRICS] + [
                ("fleetwatch_gpu_info", "gauge", "GPU identity; always 1."),
                (
                    "fleetwatch_gpu_last_sample_timestamp_seconds",
                    "gauge",
                    "Unix time of the GPU's newest sample.",
                ),
                (
                    "fleetwatch_gpu_clocks_event_active",
                    "gauge",
                    "1 while the clocks event (throttle) reason is active.",
                ),
            ]
            for (name, kind, help_text), lines in zip(headers, families, strict=True):
                if lines:
                    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
                    out.append("\n".join(lines))
                    out.append("\n")
            out.append(self._node_text(self._liveness.clock()))
            out.append(self._event_text())
            return "".join(out)

    def _gpu_lines(self, gpu: _Gpu, node_name: str) -> list[list[str]]:
        labels = (
            f'node="{escape_label(node_name)}",gpu="{gpu.index}",uuid="{escape_label(gpu.uuid)}",'
            f'model="{escape_label(gpu.model)}"'
        )
        values = gpu.latest or {}
        lines: list[list[str]] = []
        for metric in GPU_METRICS:
            value = values.get(metric.field)
            lines.append(
                []
                if value is None
                else [f"{metric.name}{{{labels}}} {_number(value, metric.scale)}"]
            )
        info = (
            f'{labels},serial="{escape_label(gpu.serial or "")}",'
            f'driver_version="{escape_label(gpu.driver_version or "")}",'
            f'pci_bus_id="{escape_label(gpu.pci_bus_id or "")}"'
        )
        lines.append([f"fleetwatch_gpu_info{{{info}}} 1"])
        lines.append(
            [
                "fleetwatch_gpu_last_sample_timestamp_seconds"
                f"{{{labels}}} {gpu.latest_ts.timestamp()}"
            ]
            if gpu.latest_ts
            else []
        )
        reasons = values.get("clocks_event_reasons")
        lines.append(
            []
            if reasons is None
            else [
                f'fleetwatch_gpu_clocks_event_active{{{labels},reason="{name}"}} '
                f"{1 if reasons & bit else 0}"
                for name, bit in THROTTLE_REASONS
            ]
        )
        return lines

    def _node_text(self, now: datetime) -> str:
        up, seen, info = [], [], []
        states: dict[NodeReading, int] = {"up": 0, "unheard": 0, "unreachable": 0}
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            name = escape_label(node.name)
            state = self._liveness.state(node.last_seen, node.interval_s, now)
            states[state] += 1
            if state != "unheard":
                up.append(f'fleetwatch_node_up{{node="{name}"}} {1 if state == "up" else 0}')
            seen.append(
                f'fleetwatch_node_last_seen_timestamp_seconds{{node="{name}"}} '
                f"{node.last_seen.timestamp()}"
            )
            extra = "".join(
                f',{k}="{escape_label(v)}"' for k, v in sorted(node.labels.items()) if k != "node"
            )
            info.append(f'fleetwatch_node_info{{node="{name}"{extra}}} 1')
        parts = [
            "# HELP fleetwatch_node_up 1 if the node reported within 3 of its intervals, 0 if not "
            "(absent while not heard since the server started).\n"
            "# TYPE fleetwatch_node_up gauge\n",
            *(line + "\n" for line in up),
            "# HELP fleetwatch_node_last_seen_timestamp_seconds Unix time of the last batch.\n"
            "# TYPE fleetwatch_node_last_seen_timestamp_seconds gauge\n",
            *(line + "\n" for line in seen),
            "# HELP fleetwatch_node_info Node labels; always 1.\n"
            "# TYPE fleetwatch_node_info gauge\n",
            *(line + "\n" for line in info),
            "# HELP fleetwatch_nodes Nodes by liveness state (up, unheard, unreachable).\n"
            "# TYPE fleetwatch_nodes gauge\n",
            *(f'fleetwatch_nodes{{state="{s}"}} {n}\n' for s, n in sorted(states.items())),
        ]
        return "".join(parts)

    def _event_text(self) -> str:
        gpu_index = {g.uuid: g.index for g in self._gpus.values()}
        parts = [
            "# HELP fleetwatch_xid_events_total Xid errors reported, by code.\n"
            "# TYPE fleetwatch_xid_events_total counter\n"
        ]
        for (node_id, uuid, xid), n in sorted(self._xids.items()):
            node = self._nodes.get(node_id)
            if node is None:
                continue
            gpu = gpu_index.get(uuid, "")
            parts.append(
                f'fleetwatch_xid_events_total{{node="{escape_label(node.name)}",gpu="{gpu}",'
                f'uuid="{escape_label(uuid)}",xid="{xid}"}} {n}\n'
            )
        parts.append(
            "# HELP fleetwatch_events_total Events reported, by kind.\n"
            "# TYPE fleetwatch_events_total counter\n"
        )
        for (node_id, kind), n in sorted(self._kinds.items()):
            node = self._nodes.get(node_id)
            if node is not None:
                name = escape_label(node.name)
                parts.append(f'fleetwatch_events_total{{node="{name}",kind="{kind}"}} {n}\n')
        return "".join(parts)
