"""The per-GPU families of a /metrics shard, from the GPUs' newest samples (``gpus.latest``).

Series: one per reported field of :data:`fleetwatch.metrics.GPU_METRICS`, labelled
``{node, gpu, uuid, model}`` (a field the GPU did not report has no line, never a 0);
``fleetwatch_gpu_info`` (identity: serial, driver, PCI bus id; always 1),
``fleetwatch_gpu_last_sample_timestamp_seconds`` and ``fleetwatch_gpu_clocks_event_active``
(one series per throttle reason). A shard reads its own GPUs' rows at each scrape: at 10 s
per sample and 15 s per scrape nearly every line changes between two scrapes, so a cache of
formatted lines (about 7 KB per GPU, 700 MB at 100,000 GPUs) would cost memory for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import select

from fleetwatch.metrics import GPU_METRICS, THROTTLE_REASONS
from fleetwatch.server.db.raw_rows import psycopg_rows
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpus
from fleetwatch.server.metrics.fleet_cache import IDS_PER_QUERY
from fleetwatch.server.metrics.text import escape_label, family_header

__all__ = ["GPU_FAMILIES", "GpuRow", "load_gpu_rows", "render_gpu_families"]

_EXTRA_FAMILIES = (
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
)
# (name, type, help) of every family this module writes, in page order.
GPU_FAMILIES: tuple[tuple[str, str, str], ...] = (
    *((m.name, m.type, m.help) for m in GPU_METRICS),
    *_EXTRA_FAMILIES,
)


class GpuRow(NamedTuple):
    """A GPU with its newest sample, as a shard renders it."""

    uuid: str
    node_id: int
    slot: int
    name: str | None
    serial: str | None
    driver_version: str | None
    pci_bus_id: str | None
    latest_ts: datetime | None
    latest: dict[str, Any] | None


_COLUMNS = (
    gpus.c.uuid,
    gpus.c.node_id,
    gpus.c.index,
    gpus.c.name,
    gpus.c.serial,
    gpus.c.driver_version,
    gpus.c.pci_bus_id,
    gpus.c.latest_ts,
    gpus.c.latest,
)
# On PostgreSQL as plain tuples (db/raw_rows.py), the shard's node ids as one array.
_SQL = (
    "SELECT uuid, node_id, index, name, serial, driver_version, pci_bus_id, latest_ts, latest"
    " FROM gpus"
)


def load_gpu_rows(db: Database, node_ids: Sequence[int] | None) -> list[GpuRow]:
    """The GPUs of ``node_ids`` (every GPU with ``None``), with their newest sample."""
    with db.read() as conn:
        where = "" if node_ids is None else " WHERE node_id = ANY(%(ids)s)"
        raw = psycopg_rows(conn, _SQL + where, {"ids": list(node_ids or ())})
        if raw is not None:
            return list(map(GpuRow._make, raw))
        if node_ids is None:
            return list(map(GpuRow._make, conn.execute(select(*_COLUMNS))))
        rows: list[GpuRow] = []
        for start in range(0, len(node_ids), IDS_PER_QUERY):
            chunk = node_ids[start : start + IDS_PER_QUERY]
            query = select(*_COLUMNS).where(gpus.c.node_id.in_(chunk))
            rows.extend(map(GpuRow._make, conn.execute(query)))
        return rows


def render_gpu_families(rows: Sequence[GpuRow], node_names: Mapping[int, str]) -> str:
    """The per-GPU families of ``rows`` whose node is in ``node_names`` (node id to name),
    ordered by node name and GPU index within each family."""
    # Values as the text format writes them: flags 0/1, unscaled numbers as read (41, 41.5),
    # scaled ones as floats (1980 MHz -> 1980000000.0).
    # Hot loop: about 47 lines per GPU, 150,000 for a shard of 3,125 GPUs. Label strings are
    # built once per GPU and escaped once per distinct value; each family's lines come from one
    # comprehension over the GPUs, no call per line.
    known = sorted(
        (row for row in rows if row.node_id in node_names),
        key=lambda row: (node_names[row.node_id], row.slot),
    )
    escaped = _EscapeMemo()
    labels = [
        f'node="{escaped(node_names[row.node_id])}",gpu="{row.slot}",'
        f'uuid="{escape_label(row.uuid)}",model="{escaped(row.name or "")}"'
        for row in known
    ]
    closed = [label + "} " for label in labels]
    values = [(row.latest or {}, end) for row, end in zip(known, closed, strict=True)]
    bodies: list[list[str]] = []
    for m in GPU_METRICS:
        field, prefix, scale = m.field, m.name + "{", m.scale
        if scale == 1.0:
            bodies.append(
                [
                    f"{prefix}{end}{int(v) if v.__class__ is bool else v!r}\n"
                    for got, end in values
                    if (v := got.get(field)) is not None
                ]
            )
        else:
            bodies.append(
                [
                    f"{prefix}{end}{int(v) if v.__class__ is bool else float(v) * scale!r}\n"
                    for got, end in values
                    if (v := got.get(field)) is not None
                ]
            )
    info = [
        f'fleetwatch_gpu_info{{{label},serial="{escape_label(row.serial or "")}",'
        f'driver_version="{escaped(row.driver_version or "")}",'
        f'pci_bus_id="{escape_label(row.pci_bus_id or "")}"}} 1\n'
        for row, label in zip(known, labels, strict=True)
    ]
    stamps = [
        f"fleetwatch_gpu_last_sample_timestamp_seconds{{{end}{row.latest_ts.timestamp()}\n"
        for row, end in zip(known, closed, strict=True)
        if row.latest_ts is not None
    ]
    reasons_suffix = [(f',reason="{name}"}} ', bit) for name, bit in THROTTLE_REASONS]
    throttles = [
        f"fleetwatch_gpu_clocks_event_active{{{label}{suffix}{1 if reasons & bit else 0}\n"
        for (got, _), label in zip(values, labels, strict=True)
        if (reasons := got.get("clocks_event_reasons")) is not None
        for suffix, bit in reasons_suffix
    ]
    return "".join(_families(GPU_FAMILIES, [*bodies, info, stamps, throttles]))


class _EscapeMemo(dict[str, str]):
    """``escape_label`` for values that repeat across GPUs (node, model, driver), once each."""

    def __call__(self, value: str) -> str:
        found = self.get(value)
        if found is None:
            found = self[value] = escape_label(value)
        return found


def _families(
    headers: Sequence[tuple[str, str, str]], bodies: Sequence[list[str]]
) -> Iterator[str]:
    for (name, kind, help_text), lines in zip(headers, bodies, strict=True):
        if lines:
            # A family's lines joined at once: a generator yielding 300,000 lines one by one
            # cost a tenth of a shard's render.
            yield family_header(name, kind, help_text) + "".join(lines)
