"""What the database holds of the samples, as one dict per sample, for tests to compare.

Samples are stored as compressed blocks (``fleetwatch.server.db.sample_blocks``); tests read
them back through the product's own reader and name each sample's node, GPU and boot."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from fleetwatch.server.db.tables import gpus, node_boots, nodes
from fleetwatch.server.repo.sample_reader import read_samples, sample_rows
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES


def stored_samples(conn: Connection, *, node_prefix: str | None = None) -> list[dict[str, Any]]:
    """Every stored sample: ``node``, ``gpu_uuid``, ``index``, ``ts``, ``boot_id``, ``node_id``,
    ``gpu_id``, ``block_id`` and every field (None: not reported), by node name, GPU index and
    time (of one node's nodes only, with ``node_prefix``)."""
    names = dict(conn.execute(select(nodes.c.id, nodes.c.name)).all())
    gpu_of = {row.id: row for row in conn.execute(select(gpus.c.id, gpus.c.uuid, gpus.c["index"]))}
    boots = dict(conn.execute(select(node_boots.c.id, node_boots.c.boot_id)).all())
    out = []
    for chunk in read_samples(conn, SAMPLE_FIELD_NAMES, after_id=0):
        for block_id, row in zip(chunk.ids.tolist(), sample_rows(chunk), strict=True):
            ts, gpu_id, node_id, boot = row[:4]
            node = names.get(node_id)
            if node_prefix is not None and not (node or "").startswith(node_prefix):
                continue
            gpu = gpu_of[gpu_id]
            out.append(
                {
                    "node": node,
                    "gpu_uuid": gpu.uuid,
                    "index": gpu.index,
                    "ts": ts,
                    "boot_id": None if boot is None else boots.get(boot),
                    "node_id": node_id,
                    "gpu_id": gpu_id,
                    "block_id": block_id,
                    **dict(zip(SAMPLE_FIELD_NAMES, row[4:], strict=True)),
                }
            )
    out.sort(key=lambda s: (s["node"] or "", s["index"], s["ts"]))
    return out
