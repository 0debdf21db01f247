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
from typing import Any

from sqlalchemy import Row, select

from fleetwatch.metrics import GPU_METRICS, THROTTLE_REASONS
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpus
from fleetwatch.server.metrics.fleet_cache import IDS_PER_QUERY
from fleetwatch.server.metrics.text import escape_label, family_header

__all__ = ["GPU_FAMILIES", "load_gpu_rows", "render_gpu_families"]

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
_COLUMNS = (
    gpus.c.uuid,
    gpus.c.node_id,
    gpus.c.index.label("slot"),  # a Row's .index is tuple.index to a type checker
    gpus.c.name,
    gpus.c.serial,
    gpus.c.driver_version,
    gpus.c.pci_bus_id,
    gpus.c.latest_ts,
    gpus.c.latest,
)


def load_gpu_rows(db: Database, node_ids: Sequence[int] | None) -> list[Any]:
    """The GPUs of ``node_ids`` (every GPU with ``None``), with their newest sample (rows of
    the columns of _COLUMNS, fetched in one batch per query rather than row by row)."""
    with db.read() as conn:
        if node_ids is None:
            return list(conn.execute(select(*_COLUMNS)).all())
        rows: list[Any] = []
        for start in range(0, len(node_ids), IDS_PER_QUERY):
            chunk = node_ids[start : start + IDS_PER_QUERY]
            rows.extend(conn.execute(select(*_COLUMNS).where(gpus.c.node_id.in_(chunk))).all())
        return rows


def render_gpu_families(rows: Sequence[Row[Any]], node_names: Mapping[int, str]) -> str:
    """The per-GPU families of ``rows`` whose node is in ``node_names`` (node id to name),
    ordered by node name and GPU index within each family."""
    # Values as the text format writes them: flags 0/1, unscaled numbers as read (41, 41.5),
    # scaled ones as floats (1980 MHz -> 1980000000.0).
    # Hot loop: about 47 lines per GPU, 300,000 for a shard of 6,250 GPUs. Label strings are
    # built once per GPU and escaped once per distinct value; no call per line but the append.
    known = sorted(
        (row for row in rows if row.node_id in node_names),
        key=lambda row: (node_names[row.node_id], row.slot),
    )
    escaped = _EscapeMemo()
    metric_lines: list[list[str]] = [[] for _ in GPU_METRICS]
    unscaled = [
        (m.field, m.name + "{", metric_lines[i])
        for i, m in enumerate(GPU_METRICS)
        if m.scale == 1.0
    ]
    scaled = [
        (m.field, m.name + "{", m.scale, metric_lines[i])
        for i, m in enumerate(GPU_METRICS)
        if m.scale != 1.0
    ]
    reasons_suffix = [(f',reason="{name}"}} ', bit) for name, bit in THROTTLE_REASONS]
    info: list[str] = []
    stamps: list[str] = []
    throttles: list[str] = []
    for row in known:
        labels = (
            f'node="{escaped(node_names[row.node_id])}",gpu="{row.slot}",'
            f'uuid="{escape_label(row.uuid)}",model="{escaped(row.name or "")}"'
        )
        closed = labels + "} "
        values: dict[str, Any] = row.latest or {}
        get = values.get
        for field, prefix, lines in unscaled:
            value = get(field)
            if value is not None:
                if value.__class__ is bool:
                    lines.append(f"{prefix}{closed}{1 if value else 0}\n")
                else:
                    lines.append(f"{prefix}{closed}{value!r}\n")
        for field, prefix, scale, lines in scaled:
            value = get(field)
            if value is not None:
                if value.__class__ is bool:
                    lines.append(f"{prefix}{closed}{1 if value else 0}\n")
                else:
                    lines.append(f"{prefix}{closed}{float(value) * scale!r}\n")
        info.append(
            f'fleetwatch_gpu_info{{{labels},serial="{escape_label(row.serial or "")}",'
            f'driver_version="{escaped(row.driver_version or "")}",'
            f'pci_bus_id="{escape_label(row.pci_bus_id or "")}"}} 1\n'
        )
        if row.latest_ts is not None:
            stamps.append(
                f"fleetwatch_gpu_last_sample_timestamp_seconds{{{closed}"
                f"{row.latest_ts.timestamp()}\n"
            )
        reasons = get("clocks_event_reasons")
        if reasons is not None:
            head = "fleetwatch_gpu_clocks_event_active{" + labels
            throttles.extend(
                f"{head}{suffix}{1 if reasons & bit else 0}\n" for suffix, bit in reasons_suffix
            )
    return "".join(_families(GPU_FAMILIES, [*metric_lines, info, stamps, throttles]))


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
