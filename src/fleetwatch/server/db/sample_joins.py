"""Reading samples by GPU UUID and boot id, which ``gpu_samples`` stores as small keys.

``select(SAMPLE_GPU_UUID, gpu_samples.c.ts, ...).select_from(SAMPLES_WITH_GPU)`` gives rows with
a ``gpu_uuid`` column as before the keys; :data:`SAMPLES_WITH_GPU_AND_BOOT` adds ``boot_id``
(null where the node sent none). To filter one GPU's samples by an index, compare
``gpu_samples.c.gpu_id`` with :func:`gpu_id_of` rather than ``gpus.c.uuid`` through the join.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ScalarSelect, select

from fleetwatch.server.db.tables import gpu_samples, gpus, node_boots

__all__ = [
    "SAMPLES_WITH_GPU",
    "SAMPLES_WITH_GPU_AND_BOOT",
    "SAMPLE_BOOT_ID",
    "SAMPLE_GPU_UUID",
    "gpu_id_of",
]

SAMPLES_WITH_GPU = gpu_samples.join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
SAMPLES_WITH_GPU_AND_BOOT = SAMPLES_WITH_GPU.outerjoin(
    node_boots, node_boots.c.id == gpu_samples.c.boot
)
SAMPLE_GPU_UUID = gpus.c.uuid.label("gpu_uuid")
SAMPLE_BOOT_ID = node_boots.c.boot_id.label("boot_id")


def gpu_id_of(uuid: str) -> ScalarSelect[Any]:
    """``gpus.id`` of the GPU ``uuid``, as a subquery the database evaluates once."""
    return select(gpus.c.id).where(gpus.c.uuid == uuid).scalar_subquery()
