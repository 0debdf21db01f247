"""Text read on the node, made safe to send: control characters become U+FFFD.

A kernel log line, an ``nvidia-smi`` string or a dcgm-exporter label can hold a NUL byte or
another control character (a process name with a NUL has been seen in a real kernel log). The
server cannot store a NUL in PostgreSQL text, and a batch holding one was stuck at the head of the
spool. Rather than drop the event (an Xid 79 must reach the server), every C0/C1 control character
(``U+0000``-``U+001F``, ``U+007F``-``U+009F``, tab and newline included: these are one-line
fields) and every lone surrogate becomes U+FFFD REPLACEMENT CHARACTER, one for one, so lengths and
the rest of the text are unchanged and the operator sees where something was replaced.

:func:`clean_text` is applied where text enters (the kernel log parser), :func:`clean_fields`
where a source's strings become wire objects (GPU identities from NVML, nvidia-smi and
dcgm-exporter: the wire models refuse a NUL, so it must go before they are built), and
:func:`clean_batch` once more to every text field of a batch before it is spooled, whatever
collector it came from.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel

from fleetwatch.telemetry import Batch

__all__ = ["REPLACEMENT", "clean_batch", "clean_fields", "clean_text"]

REPLACEMENT = "\ufffd"
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_text(text: str) -> str:
    return _UNSAFE.sub(REPLACEMENT, text)


def clean_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every string value cleaned (keys are the wire's own names)."""
    return {key: _clean_value(value) for key, value in fields.items()}


def clean_batch(batch: Batch) -> Batch:
    """The batch with every text field cleaned (the same object when nothing needed it)."""
    node = _clean_model(batch.node)
    gpus = [_clean_model(gpu) for gpu in batch.gpus]
    events = [_clean_model(event) for event in batch.events]
    if (
        node is batch.node
        and all(a is b for a, b in zip(gpus, batch.gpus, strict=True))
        and all(a is b for a, b in zip(events, batch.events, strict=True))
    ):
        return batch
    return batch.model_copy(update={"node": node, "gpus": gpus, "events": events})


_Model = TypeVar("_Model", bound=BaseModel)


def _clean_model(model: _Model) -> _Model:
    update = {}
    for name, value in model:
        cleaned = _clean_value(value)
        if cleaned is not value:
            update[name] = cleaned
    return model.model_copy(update=update) if update else model


def _clean_value(value: Any) -> Any:
    """Strings, and the strings (keys included) inside dicts, lists and nested wire models (a
    GPU's MIG layout); the same object when nothing changed."""
    if isinstance(value, str):
        return clean_text(value) if _UNSAFE.search(value) else value
    if isinstance(value, BaseModel):
        return _clean_model(value)
    if isinstance(value, dict):
        items = [(_clean_value(k), _clean_value(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list):
        cleaned = [_clean_value(v) for v in value]
        if all(a is b for a, b in zip(cleaned, value, strict=True)):
            return value
        return cleaned
    return value
