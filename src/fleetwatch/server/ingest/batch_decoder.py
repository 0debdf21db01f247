"""Decoding and validating an ingest body: msgspec on the hot path, pydantic for every answer.

:func:`decode_batch` first decodes the body with msgspec into
:mod:`fleetwatch.server.ingest.batch_structs` and checks what the structs cannot say (stored text,
timestamps, PCI slots, event details: storable, and readable where the rules read them,
:mod:`fleetwatch.event_details`; the batch's limits), in C or once per distinct value, never
once per sample field in Python. That path only ever says yes: for a body it cannot vouch for,
whatever the reason, the wire format's pydantic models (:func:`validate_with_models`) decide,
and any 422 is theirs, word for word. So the fast path must accept nothing pydantic refuses and
must decode to the same values; ``tests/unit/server/ingest/test_batch_decoder.py`` checks both
over a generated corpus of valid and hostile bodies. A body the fast path leaves to pydantic and
pydantic accepts (a form only pydantic reads, such as a timestamp with an hour-only offset) is
stored as usual, at pydantic's cost.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta
from typing import Any

import msgspec
from pydantic import ValidationError

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput
from fleetwatch.event_details import details_problem
from fleetwatch.server.ingest.batch_structs import (
    SAMPLE_UUID_PATTERN,
    BatchStruct,
    EventStruct,
    GpuStruct,
    NodeStruct,
    SampleStruct,
)
from fleetwatch.server.ingest.checks import collapse_duplicate_samples, locate_unreadable
from fleetwatch.server.ingest.wire_time import parse_timestamp
from fleetwatch.storable import json_value_problem, text_problem
from fleetwatch.telemetry import Batch, IngestLimits, normalize_pci_bus_id

__all__ = ["decode_batch", "decode_fast", "ingest_limits", "structs_of", "validate_with_models"]

_DECODER = msgspec.json.Decoder(BatchStruct)
_GPU_UUID = re.compile(SAMPLE_UUID_PATTERN)
# pydantic's JSON parser refuses nesting deeper than about 200 levels (counted from the body's
# top); details nested deeper than this are left to it to judge.
_MOST_DETAILS_DEPTH = 64
# A node's GPUs keep their slots: each text is normalised once per process, not once per batch.
_normalized_pci = functools.lru_cache(maxsize=4096)(normalize_pci_bus_id)


def ingest_limits(settings: ServerSettings, now: datetime) -> IngestLimits:
    """The limits a batch arriving ``now`` is held to under ``settings``."""
    return IngestLimits(
        now=now,
        max_future_skew=timedelta(seconds=settings.max_future_skew_s),
        max_past_age=timedelta(seconds=settings.max_past_age_s),
        max_gpus=settings.max_gpus_per_batch,
        max_samples=settings.max_samples_per_batch,
        max_events=settings.max_events_per_batch,
    )


class _Unvouched(Exception):
    """The fast path cannot vouch for this body: the pydantic models decide."""


def decode_batch(body: bytes, limits: IngestLimits) -> BatchStruct:
    """The batch in ``body``, validated as the wire format says, with repeated samples collapsed.

    Raises :class:`InvalidInput` (422) naming each field that is wrong; nothing is stored then.
    """
    batch = decode_fast(body, limits)
    if batch is None:
        batch = structs_of(validate_with_models(body, limits))
    return collapse_duplicate_samples(batch)


def decode_fast(body: bytes, limits: IngestLimits) -> BatchStruct | None:
    """The batch when msgspec and the checks below vouch for it; None leaves it to pydantic."""
    try:
        batch = _DECODER.decode(body)
        if batch.ports:
            return None  # adapter ports are validated by the pydantic models only
        if (
            len(batch.gpus) > limits.max_gpus
            or len(batch.samples) > limits.max_samples
            or len(batch.events) > limits.max_events
        ):
            return None
        _check_gpus(batch.gpus)
        _check_samples(batch.samples)
        _check_events(batch.events)
        _check_text(batch)
        _convert_timestamps(batch, limits)
    except (msgspec.DecodeError, RecursionError, _Unvouched):
        return None
    return batch


def _check_gpus(gpus: list[GpuStruct]) -> None:
    for gpu in gpus:
        if gpu.mig is not None:
            raise _Unvouched  # a MIG layout is validated by the pydantic models only
        if gpu.pci_bus_id is not None:
            gpu.pci_bus_id = _pci(gpu.pci_bus_id)


def _check_samples(samples: list[SampleStruct]) -> None:
    # A batch names each GPU once per tick: check each distinct uuid once.
    if not all(map(_GPU_UUID.match, {s.uuid for s in samples})):
        raise _Unvouched


def _check_events(events: list[EventStruct]) -> None:
    for event in events:
        if event.kind == "xid" and event.xid is None:
            raise _Unvouched
        if event.pci_bus_id is not None:
            event.pci_bus_id = _pci(event.pci_bus_id)
        if event.details is not None and not _storable_details(event.kind, event.details):
            raise _Unvouched


def _pci(text: str) -> str:
    try:
        return _normalized_pci(text)
    except ValueError:
        raise _Unvouched from None


def _storable_details(kind: str, details: dict[str, Any]) -> bool:
    """Storable, not too deep, and readable where the rules read it (the same check as the
    models': a body either path refuses gets the models' 422)."""
    return (
        json_value_problem(details) is None
        and _depth(details) <= _MOST_DETAILS_DEPTH
        and details_problem(kind, details) is None
    )


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            pending.extend((inner, level + 1) for inner in item)
    return deepest


def _check_text(batch: BatchStruct) -> None:
    """No NUL or lone surrogate in any free text (patterned fields cannot hold one)."""
    node = batch.node
    texts: list[str | None] = [node.agent_version, node.boot_id, *node.labels.values()]
    for gpu in batch.gpus:
        texts += (gpu.serial, gpu.name, gpu.driver_version, gpu.vbios_version)
    for event in batch.events:
        texts += (event.message, event.process)
    # One scan of them all: a separator adds no NUL and no surrogate.
    if text_problem("\n".join(filter(None, texts))) is not None:
        raise _Unvouched


def _convert_timestamps(batch: BatchStruct, limits: IngestLimits) -> None:
    """Each timestamp's text becomes its UTC datetime, parsed once per distinct text."""
    # Any: until this function returns, ts holds text (batch_structs.WireTimestamp).
    samples: list[Any] = batch.samples
    events: list[Any] = batch.events
    texts = {s.ts for s in samples}
    texts.update(e.ts for e in events)
    stamps = {}
    for text in texts:
        value = parse_timestamp(text, limits)
        if value is None:
            raise _Unvouched
        stamps[text] = value
    for sample in samples:
        sample.ts = stamps[sample.ts]
    for event in events:
        event.ts = stamps[event.ts]


# -- the wire format's own models: the reference, and the author of every 422 ------------------


def validate_with_models(body: bytes, limits: IngestLimits) -> Batch:
    """``body`` validated by :class:`fleetwatch.telemetry.Batch`, or :class:`InvalidInput`
    naming every problem (at most 100), and where the JSON cannot be read, where it fails."""
    try:
        return Batch.model_validate_json(body, context={"limits": limits})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        located = (
            locate_unreadable(body) if any(e["type"] == "json_invalid" for e in errors) else []
        )
        detail = located or [_detail(err) for err in errors]
        first = detail[0]
        where = ".".join(str(p) for p in first["loc"])
        more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
        raise InvalidInput(
            f"invalid batch: {where}: {first['msg']}{more}; nothing was stored", detail[:100]
        ) from None


# The errors of telemetry.Event's details check: where inside details, in their ctx.
_PATH_IN_CTX = frozenset({"unstorable_value", "unreadable_detail"})


def _detail(err: Any) -> dict[str, Any]:
    # A problem deep inside free-form JSON (an event's details) carries its path in ctx.
    inner = err.get("ctx", {}).get("path", ()) if err["type"] in _PATH_IN_CTX else ()
    return {
        "loc": ["body", *err["loc"], *inner],
        "msg": err["msg"].removeprefix("Value error, "),
    }


def structs_of(batch: Batch) -> BatchStruct:
    """The structs holding what pydantic validated (and normalised), value for value."""
    return BatchStruct(
        batch_id=batch.batch_id,
        node=NodeStruct(**batch.node.model_dump()),
        gpus=[
            GpuStruct(
                **gpu.model_dump(exclude={"mig"}),
                mig=None if gpu.mig is None else gpu.mig.model_dump(exclude_none=True),
            )
            for gpu in batch.gpus
        ],
        samples=[SampleStruct(**sample.model_dump()) for sample in batch.samples],
        events=[EventStruct(**event.model_dump()) for event in batch.events],
        ports=None
        if batch.ports is None
        else [port.model_dump(exclude_none=True) for port in batch.ports],
    )
