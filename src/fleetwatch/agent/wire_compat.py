"""Pushing to a server older than the agent: leave out the newer optional fields it refuses.

Wire v1 grows by optional fields, and a server's wire models refuse fields they do not know. A
server from before ``GpuIdentity.mig`` answers a batch that carries one with a 422 that names
exactly that field::

    {"error": "invalid batch: body.gpus.1.mig: Extra inputs are not permitted; nothing was stored",
     "detail": [{"loc": ["body", "gpus", 1, "mig"], "msg": "Extra inputs are not permitted", ...}]}

(recorded from the server at commit 78ba9bd). A server from before ``Batch.ports`` (adapter
ports) answers the same way for the batch's top-level field: ``loc ["body", "ports"]``. When
*every* problem the server names is such a field, :func:`without_newer_fields` gives the same
batch without them, which that server takes: the GPU readings arrive, only the newer detail (the
MIG layout, the ports) is lost there. The spooled bytes stay
as they were; the reduced body is derived from them the same way every time (same JSON text,
gzip with a fixed mtime), so a replay of it is byte-identical and the server's duplicate check
(on the decompressed body) still holds.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import httpx

__all__ = [
    "NEWER_BATCH_FIELDS",
    "NEWER_GPU_FIELDS",
    "refuses_only_newer_fields",
    "without_newer_fields",
]

# Optional fields added to wire v1 after servers that forbid unknown fields shipped: of
# GpuIdentity, and of the Batch itself.
NEWER_GPU_FIELDS = frozenset({"mig"})
NEWER_BATCH_FIELDS = frozenset({"ports"})
_EXTRA_FIELD = "extra inputs are not permitted"


def refuses_only_newer_fields(response: httpx.Response) -> bool:
    """A 422 whose every problem is one of :data:`NEWER_GPU_FIELDS` or
    :data:`NEWER_BATCH_FIELDS` unknown to the server."""
    if response.status_code != 422:
        return False
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return False
    return bool(detail) and isinstance(detail, list) and all(map(_is_newer_field, detail))


def _is_newer_field(problem: Any) -> bool:
    if not isinstance(problem, dict):
        return False
    loc, msg = problem.get("loc"), str(problem.get("msg", "")).lower()
    if not isinstance(loc, list) or not (
        problem.get("type") == "extra_forbidden" or _EXTRA_FIELD in msg
    ):
        return False
    if len(loc) == 2:
        return loc[0] == "body" and loc[1] in NEWER_BATCH_FIELDS
    return (
        len(loc) == 4
        and loc[:2] == ["body", "gpus"]
        and isinstance(loc[2], int)
        and loc[3] in NEWER_GPU_FIELDS
    )


def without_newer_fields(body: bytes) -> bytes | None:
    """The gzip batch ``body`` without any of :data:`NEWER_GPU_FIELDS` and
    :data:`NEWER_BATCH_FIELDS` (gzip again), or ``None`` when it has none of them or is not a
    gzip JSON batch."""
    try:
        batch = json.loads(gzip.decompress(body))
    except (OSError, EOFError, zlib.error, ValueError):
        return None
    if not isinstance(batch, dict):
        return None
    dropped = False
    for name in NEWER_BATCH_FIELDS & batch.keys():
        del batch[name]
        dropped = True
    gpus = batch.get("gpus", [])
    if not isinstance(gpus, list):
        return None
    for gpu in gpus:
        if isinstance(gpu, dict):
            for name in NEWER_GPU_FIELDS & gpu.keys():
                del gpu[name]
                dropped = True
    if not dropped:
        return None
    text = json.dumps(batch, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)
