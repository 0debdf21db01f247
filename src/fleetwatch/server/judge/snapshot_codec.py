"""A :class:`FleetAssessment` as bytes, and back: what the leader stores for the other processes.

Layout (:data:`FORMAT` 1): zlib-compressed msgpack of :class:`_Snapshot`. Each GPU and each
verdict is a msgpack array, not a map, so a 100,000-GPU snapshot does not repeat its field names
100,000 times; a GPU's covariates are a list aligned with the snapshot's ``feature_names`` (None
where the GPU has none of that name: absent stays absent). The risk model is not in it, only its
version: a reader loads that version's parameters from ``risk_models`` itself.

What does not survive the trip: tuples inside a verdict's evidence come back as lists (evidence is
JSON-shaped already: it is stored and served as JSON).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.judging import Verdict

__all__ = ["FORMAT", "SnapshotFormatError", "decode_snapshot", "encode_snapshot"]

FORMAT = 1
# Level 1: at 100,000 GPUs most of the size goes at the first level, at a fraction of the time.
_ZLIB_LEVEL = 1


class SnapshotFormatError(ValueError):
    """A stored snapshot this process cannot read (another format, or damaged)."""


class _Verdict(msgspec.Struct, array_like=True, frozen=True):
    kind: str
    rule: str
    severity: str
    action: str
    counts_against_gpu: bool
    source: str
    first_seen: datetime | None
    last_seen: datetime | None
    xids: tuple[int, ...]
    evidence: dict[str, Any]
    note: str


class _Gpu(msgspec.Struct, array_like=True, frozen=True):
    uuid: str
    node: str
    index: int
    serial: str | None
    sku: str | None
    installed_at: datetime
    age_days: float
    features: list[float | None]
    verdicts: list[_Verdict]


class _Snapshot(msgspec.Struct, frozen=True):
    format: int
    at: datetime
    fleet_at: datetime | None
    nodes_at: dict[str, datetime]
    model_version: int | None
    feature_names: list[str]
    gpus: list[_Gpu]


def _verdict_out(v: Verdict) -> _Verdict:
    return _Verdict(
        v.kind,
        v.rule,
        v.severity,
        v.action,
        v.counts_against_gpu,
        v.source,
        v.first_seen,
        v.last_seen,
        tuple(v.xids),
        dict(v.evidence),
        v.note,
    )


def encode_snapshot(snapshot: FleetAssessment) -> bytes:
    """The snapshot's GPUs, verdicts, times and model version, compressed."""
    names = sorted({name for gpu in snapshot.gpus for name in gpu.features})
    gpus = [
        _Gpu(
            g.uuid,
            g.node,
            g.index,
            g.serial,
            g.sku,
            g.installed_at,
            g.age_days,
            [g.features.get(name) for name in names] if g.features else [],
            [_verdict_out(v) for v in g.verdicts],
        )
        for g in snapshot.gpus
    ]
    body = _Snapshot(
        FORMAT,
        snapshot.at,
        snapshot.fleet_at,
        dict(snapshot.nodes_at),
        snapshot.model_version,
        names,
        gpus,
    )
    return zlib.compress(msgspec.msgpack.encode(body), _ZLIB_LEVEL)


_DECODER = msgspec.msgpack.Decoder(_Snapshot)


def decode_snapshot(body: bytes, bundle_of: Callable[[int], RiskBundle | None]) -> FleetAssessment:
    """The snapshot ``body`` encodes; ``bundle_of(version)`` gives the risk model it was scored
    with (None: that version is gone, and the snapshot scores nothing). Raises
    :class:`SnapshotFormatError` for a body of another format or a damaged one."""
    try:
        raw = _DECODER.decode(zlib.decompress(body))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise SnapshotFormatError(f"unreadable snapshot: {exc}") from exc
    if raw.format != FORMAT:
        raise SnapshotFormatError(f"snapshot format {raw.format}, this server reads {FORMAT}")
    names = raw.feature_names
    # One string object per node name and per SKU, as the assessment itself keeps them.
    shared: dict[str | None, str | None] = {}
    gpus = []
    for g in raw.gpus:
        features = {n: v for n, v in zip(names, g.features, strict=False) if v is not None}
        gpus.append(
            GpuAssessment(
                uuid=g.uuid,
                node=shared.setdefault(g.node, g.node) or g.node,
                index=g.index,
                serial=g.serial,
                sku=shared.setdefault(g.sku, g.sku),
                installed_at=g.installed_at,
                age_days=g.age_days,
                features=features,
                verdicts=tuple(Verdict(**msgspec.structs.asdict(v)) for v in g.verdicts),
            )
        )
    version = raw.model_version
    return FleetAssessment(
        raw.at,
        gpus,
        bundle_of(version) if version is not None else None,
        version,
        fleet_at=raw.fleet_at,
        nodes_at=raw.nodes_at,
    )
