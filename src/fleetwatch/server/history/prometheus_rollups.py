"""Range-query results of dcgm-exporter series, as hourly rollups: the pure half of
``fleetwatch import prometheus`` (nothing here reads the database, the network or the clock).

The series go through the remote-write path's own reading
(:func:`~fleetwatch.server.ingest.remote_write_readings.read_request`, which groups the values of
one node at one timestamp as one scrape and maps them with the agent's
:func:`~fleetwatch.agent.parsers.dcgm_exporter.read_dcgm_samples`): a range query stamps every
series with the same evaluation times, so each step of a node is one scrape, and a GPU is read
exactly as a remote-write request would be. Each GPU-hour's samples are then folded by the
server's own :func:`~fleetwatch.models.telemetry_features.rollup_hour`.

Xids: ``DCGM_FI_DEV_XID_ERRORS`` is the code of the last Xid, not a count. A step whose code
differs from the GPU's previous step and is not 0 counts one Xid of that code in its hour (the
remote-write path turns such a change into an Xid event). The first step read has no previous
one, so the code it shows (an Xid of unknown age) counts nothing; and the same code twice in a
row is one Xid, as Prometheus cannot tell them apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetwatch.models.telemetry_features import HourRollup, rollup_hour
from fleetwatch.remote_write.wire import Series
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.ingest.remote_write_readings import ReadingLimits, read_request

__all__ = ["ChunkRollups", "GpuSeen", "XidState", "rollups_of"]

_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)

XidState = dict[str, int]  # GPU UUID -> the last Xid code its previous step showed


@dataclass
class GpuSeen:
    """A GPU as the newest step of a chunk showed it: its node and identity (GpuStruct's
    fields, ``index`` always)."""

    node: str
    identity: dict[str, Any]


@dataclass
class ChunkRollups:
    rollups: list[HourRollup] = field(default_factory=list)
    gpus: dict[str, GpuSeen] = field(default_factory=dict)
    samples: int = 0  # GPU samples (one GPU at one step) read
    refused: dict[str, int] = field(default_factory=dict)  # outcome -> series values not read


def rollups_of(
    series: Iterable[Series],
    *,
    node_labels: Sequence[str],
    catalog: XidCatalog,
    xid_state: XidState,
) -> ChunkRollups:
    """The rollups of every GPU-hour ``series`` hold samples of. The caller gives whole hours:
    an hour split over two calls would become two rollups. ``xid_state`` carries each GPU's last
    Xid code from one call to the next (updated in place)."""
    limits = ReadingLimits(
        now=_LATEST,
        oldest=_EARLIEST,
        newest=_LATEST,
        node_labels=node_labels,
        ha_cluster_label="",  # an HA pair's replicas are one history here
        ha_replica_label="__replica__",
    )
    readings = read_request(series, limits)
    out = ChunkRollups(refused={k: v for k, v in readings.samples.items() if k != "used"})
    by_hour: dict[tuple[str, datetime], list[dict[str, Any]]] = defaultdict(list)
    newest: dict[str, datetime] = {}
    for piece in readings.pieces:
        by_hour[(piece.uuid, _floor_hour(piece.ts))].append({"ts": piece.ts, **piece.values})
        if piece.ts >= newest.get(piece.uuid, _EARLIEST):
            newest[piece.uuid] = piece.ts
            out.gpus[piece.uuid] = GpuSeen(piece.node, dict(piece.identity))
    out.samples = len(readings.pieces)
    xids = _xids_by_hour(((x.uuid, x.ts, x.code) for x in readings.xids), xid_state)
    for (uuid, hour), samples in sorted(by_hour.items()):
        samples.sort(key=lambda sample: sample["ts"])
        out.rollups.append(
            rollup_hour(uuid, hour, samples, xids.get((uuid, hour), ()), catalog=catalog)
        )
    return out


def _xids_by_hour(
    observations: Iterable[tuple[str, datetime, int]], state: XidState
) -> Mapping[tuple[str, datetime], list[int]]:
    """Xid codes per (GPU, hour): each change of a GPU's last-Xid code to a new nonzero one."""
    out: dict[tuple[str, datetime], list[int]] = defaultdict(list)
    for uuid, ts, code in sorted(observations):
        previous = state.get(uuid)
        state[uuid] = code
        if previous is not None and code != previous and code != 0:
            out[(uuid, _floor_hour(ts))].append(code)
    return out


def _floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)
