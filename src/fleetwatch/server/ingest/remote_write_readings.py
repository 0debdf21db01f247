"""What one remote-write request says, as FleetWatch readings: pieces of GPU samples, last-Xid
observations and node_exporter series, each under its node.

dcgm-exporter's series are read through the agent's own mapping
(:func:`fleetwatch.agent.parsers.dcgm_exporter.read_dcgm_samples`), one scrape at a time: the
samples of one node taken at one instant are what one scrape of its exporter gave, since
Prometheus stamps every sample of a scrape with the scrape's time. Prometheus splits a scrape
across requests (``max_samples_per_send``) and shards, so what a request holds of a GPU at an
instant is a *piece* of a sample; the server stages the pieces and stores the sample once the
scrape is complete (:mod:`fleetwatch.server.ingest.remote_write_store`).

Nothing here reads the database or the clock: the caller passes ``now`` and its settings.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from pydantic import ValidationError

from fleetwatch.agent.parsers.dcgm_exporter import DcgmSample, is_dcgm_metric, read_dcgm_samples
from fleetwatch.remote_write.wire import Series
from fleetwatch.server.ingest.batch_structs import GpuStruct, SampleStruct
from fleetwatch.telemetry import MigIdentity, NodeInfo

__all__ = [
    "GpuPiece",
    "MAX_HA_LABEL",
    "HaReplica",
    "ReadingLimits",
    "RequestReadings",
    "XidObservation",
    "limits_for",
    "node_name",
    "read_request",
]

MAX_HA_LABEL = 256  # characters of an HA cluster or replica label value that are stored
_NODE_NAME = re.compile(str(NodeInfo.model_json_schema()["properties"]["name"]["pattern"]))
_PORT_SUFFIX = re.compile(r":[0-9]{1,5}$")


@dataclass(frozen=True)
class GpuPiece:
    """What a request says of one GPU at one instant (possibly not all of its scrape)."""

    node: str
    uuid: str
    ts: datetime
    identity: dict[str, Any]  # GpuIdentity's fields (index always), mig as its JSON
    values: dict[str, Any]  # canonical sample fields, validated


@dataclass(frozen=True)
class XidObservation:
    """``DCGM_FI_DEV_XID_ERRORS`` of one GPU at one instant: the code of its last Xid."""

    node: str
    uuid: str
    ts: datetime
    code: int
    identity: dict[str, Any]


@dataclass(frozen=True)
class HaReplica:
    cluster: str
    replica: str


@dataclass(frozen=True)
class ReadingLimits:
    now: datetime
    oldest: datetime  # older samples are refused (counted too_old)
    newest: datetime  # newer ones too (counted invalid: a clock ahead)
    node_labels: Sequence[str]
    ha_cluster_label: str
    ha_replica_label: str


@dataclass
class RequestReadings:
    pieces: list[GpuPiece] = field(default_factory=list)
    xids: list[XidObservation] = field(default_factory=list)
    # node -> (metric name, labels, value, ts) of the node_exporter series, for their mapping
    node_series: dict[str, list[tuple[str, dict[str, str], float, datetime]]] = field(
        default_factory=dict
    )
    ha: HaReplica | None = None
    series: Counter[str] = field(default_factory=Counter)  # outcome -> series
    samples: Counter[str] = field(default_factory=Counter)  # outcome -> samples


def node_name(labels: Mapping[str, str], label_names: Sequence[str]) -> str | None:
    """The node a series belongs to: the first of ``label_names`` it carries (an ``instance``'s
    ``:port`` dropped); None when none names a valid node."""
    for label in label_names:
        value = labels.get(label)
        if not value:
            continue
        if label == "instance":
            value = _PORT_SUFFIX.sub("", value).strip("[]")
        return value if _NODE_NAME.match(value) else None
    return None


def read_request(
    series: Iterable[Series],
    limits: ReadingLimits,
    *,
    is_node_series: Any = lambda name: False,
) -> RequestReadings:
    """Sort a request's series into GPU pieces, last-Xid observations and node_exporter series
    (``is_node_series(name)`` says which names its mapping reads), counting the rest."""
    out = RequestReadings()
    scrapes: dict[tuple[str, int], list[DcgmSample]] = defaultdict(list)
    first = True
    for one in series:
        labels = one.labels
        name = labels.get("__name__", "")
        if first:  # external labels are on every series: the first one says
            out.ha, first = _ha_replica(labels, limits), False
        dcgm = is_dcgm_metric(name)
        if not dcgm and not is_node_series(name):
            out.series["unused"] += 1
            out.samples["unused"] += len(one.samples)
            continue
        node = node_name(labels, limits.node_labels)
        if node is None:
            out.series["no_node"] += 1
            out.samples["no_node"] += len(one.samples)
            continue
        out.series["used"] += 1
        labels = {k: v for k, v in labels.items() if k != limits.ha_replica_label}
        for ts_ms, value in one.samples:
            ts = datetime.fromtimestamp(ts_ms / 1000, UTC)
            if ts < limits.oldest:
                out.samples["too_old"] += 1
            elif ts > limits.newest:
                out.samples["invalid"] += 1
            elif dcgm:
                scrapes[(node, ts_ms)].append(DcgmSample((name,), labels, value))
            else:
                out.node_series.setdefault(node, []).append((name, labels, value, ts))
    for (node, ts_ms), samples in scrapes.items():
        _read_scrape(out, node, datetime.fromtimestamp(ts_ms / 1000, UTC), samples)
    return out


def _ha_replica(labels: Mapping[str, str], limits: ReadingLimits) -> HaReplica | None:
    """The request's HA pair and replica; None without both labels, or with one longer than
    :data:`MAX_HA_LABEL` (the request is then stored as any other)."""
    cluster = labels.get(limits.ha_cluster_label, "")
    replica = labels.get(limits.ha_replica_label, "")
    if not (0 < len(cluster) <= MAX_HA_LABEL and 0 < len(replica) <= MAX_HA_LABEL):
        return None
    return HaReplica(cluster, replica)


def _read_scrape(out: RequestReadings, node: str, ts: datetime, samples: list[DcgmSample]) -> None:
    scrape = read_dcgm_samples(samples)
    for reading in scrape.readings:
        identity = _identity(reading.identity)
        if identity is None:
            out.samples["invalid"] += len(reading.values) or 1
            continue
        uuid = identity.pop("uuid")
        values = _valid_values(uuid, reading.values, out)
        if values:
            out.pieces.append(GpuPiece(node, uuid, ts, identity, values))
        code = scrape.last_xid.get(uuid)
        if code is not None and code >= 0:
            out.xids.append(XidObservation(node, uuid, ts, code, identity))


def _identity(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """The reading's identity as the wire's GpuIdentity would accept it; None when it cannot
    name a stored GPU (no UUID or index, or a value the wire refuses)."""
    identity = {k: v for k, v in raw.items() if k != "mig"}
    try:
        msgspec.convert(identity, GpuStruct)
    except msgspec.ValidationError:
        return None
    if "mig" in raw:
        try:
            identity["mig"] = MigIdentity.model_validate(raw["mig"]).model_dump(exclude_none=True)
        except ValidationError:
            pass  # a layout the wire refuses: the GPU is still stored, without it
    return identity


def _valid_values(uuid: str, values: Mapping[str, Any], out: RequestReadings) -> dict[str, Any]:
    """``values`` less any the wire's bounds refuse (each counted invalid)."""
    try:
        msgspec.convert({"uuid": uuid, "ts": "", **values}, SampleStruct)
        return dict(values)
    except msgspec.ValidationError:
        kept = {}
        for name, value in values.items():
            try:
                msgspec.convert({"uuid": uuid, "ts": "", name: value}, SampleStruct)
                kept[name] = value
            except msgspec.ValidationError:
                out.samples["invalid"] += 1
        return kept


def limits_for(settings: Any, now: datetime) -> ReadingLimits:
    """The limits a request arriving ``now`` is read under (``settings``: ServerSettings)."""
    window = min(settings.remote_write_dedup_window_s, settings.max_past_age_s)
    return ReadingLimits(
        now=now,
        oldest=now - timedelta(seconds=window),
        newest=now + timedelta(seconds=settings.max_future_skew_s),
        node_labels=settings.remote_write_node_labels,
        ha_cluster_label=settings.remote_write_ha_cluster_label,
        ha_replica_label=settings.remote_write_ha_replica_label,
    )
