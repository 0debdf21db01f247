"""A :class:`FleetAssessment` as bytes, and back: what the leader stores for the other processes.

Layout (:data:`FORMAT` 1): zlib-compressed msgpack of :class:`_Snapshot`. Each GPU and each
verdict is a msgpack array, not a map, so a 100,000-GPU snapshot does not repeat its field names
100,000 times; a GPU's covariates are a list aligned with the snapshot's ``feature_names`` (None
where the GPU has none of that name: absent stays absent). The risk model is not in it, only its
version: a reader loads that version's parameters from ``risk_models`` itself.

What does not survive the trip: tuples inside a verdict's evidence come back as lists (evidence is
JSON-shaped already: it is stored and served as JSON).

One node's values never stop the whole snapshot: a verdict whose evidence msgpack cannot hold (an
integer past 64 bits, once three EDAC counts summed past 2**64 stopped every replica adopting the
leader's judgement, issue 35) is kept with its integers clamped to 64 bits, or failing that
without its evidence, marked ``unencodable``; :func:`encode_snapshot` says what it repaired.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.storable import INT64_MAX, INT64_MIN

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


def encode_snapshot(snapshot: FleetAssessment, repaired: list[str] | None = None) -> bytes:
    """The snapshot's GPUs, verdicts, times and model version, compressed. A part msgpack
    cannot hold is repaired (see the module) and named in ``repaired``, once per node and rule."""
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
    try:
        raw = _ENCODER.encode(body)
    except _UNENCODABLE:  # found GPU by GPU: only a failing snapshot pays for that
        notes: dict[str, None] = {}
        body = msgspec.structs.replace(body, gpus=_repaired_gpus(gpus, notes))
        raw = _ENCODER.encode(body)
        if repaired is not None:
            repaired.extend(notes)
    return zlib.compress(raw, _ZLIB_LEVEL)


_ENCODER = msgspec.msgpack.Encoder()
# What msgspec raises for a value msgpack cannot hold: OverflowError for an integer outside
# [-2**63, 2**64), TypeError for a type it does not know.
_UNENCODABLE = (OverflowError, TypeError, ValueError, msgspec.EncodeError)


def _repaired_gpus(gpus: list[_Gpu], notes: dict[str, None]) -> list[_Gpu]:
    """``gpus`` with each unencodable verdict repaired; a GPU still unencodable is left out."""
    out = []
    for gpu in gpus:
        try:
            _ENCODER.encode(gpu)
        except _UNENCODABLE:
            verdicts = [_repaired_verdict(v, gpu, notes) for v in gpu.verdicts]
            gpu = msgspec.structs.replace(gpu, verdicts=verdicts)
            try:
                _ENCODER.encode(gpu)
            except _UNENCODABLE as exc:
                notes[f"node {gpu.node} GPU {gpu.uuid}: left out ({_why(exc)})"] = None
                continue
        out.append(gpu)
    return out


def _repaired_verdict(v: _Verdict, gpu: _Gpu, notes: dict[str, None]) -> _Verdict:
    try:
        _ENCODER.encode(v)
    except _UNENCODABLE as exc:
        why = _why(exc)
    else:
        return v
    notes[f"node {gpu.node} verdict {v.rule}: evidence clamped ({why})"] = None
    fixed = msgspec.structs.replace(v, evidence={**_clamped(v.evidence), "unencodable": why})
    try:
        _ENCODER.encode(fixed)
    except _UNENCODABLE:
        return msgspec.structs.replace(v, evidence={"unencodable": why})
    return fixed


def _clamped(value: Any) -> Any:
    """``value`` (JSON-shaped evidence) with each integer clamped to a signed 64-bit one and
    anything msgpack does not know as its text."""
    if isinstance(value, bool) or value is None or isinstance(value, str | float | datetime):
        return value
    if isinstance(value, int):
        return min(max(value, INT64_MIN), INT64_MAX)
    if isinstance(value, Mapping):
        return {str(k): _clamped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clamped(v) for v in value]
    return str(value)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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
