"""What the rules read from an event's ``details``, and the one check that it is readable.

``details`` is free-form on the wire (:class:`fleetwatch.telemetry.Event`): a server stores kinds
it does not know as they are. For the kinds the server's rules judge, though, a value of the wrong
type is not an extra, it is evidence the rules cannot read: a list where a machine check's bank
number goes made every assessment of its node raise, and the node went unjudged (issue 35).

:data:`DETAIL_FIELDS` names, per kind, each key a rule reads (``rules/host_errors.py``,
``rules/host_evidence.py``, ``rules/port_health.py``) and what it must hold; keys not named stay
free-form, and null is always allowed (it means absent). :func:`details_problem` is the one check:
ingest refuses a batch with it (the pydantic model and the msgspec fast path alike, so both answer
the same 422), and the rules skip and name an event stored before it existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fleetwatch.storable import INT64_MAX, shown

__all__ = ["DETAIL_FIELDS", "MAX_EVENT_COUNT", "Expect", "details_problem"]

# The most errors one event may count (an EDAC line's "<n> CE"): the kernel's own count is 16
# bits wide, and a day of the most events a batch may hold, one batch a second, each at this
# count, still sums within a signed 64-bit integer (the rules saturate past it regardless).
MAX_EVENT_COUNT = 2**32 - 1

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Expect:
    """What one key of ``details`` must hold (besides null)."""

    type: Literal["text", "integer", "number", "texts"]
    low: int | None = None
    high: int | None = None
    why: str = ""  # what the value is, for the message

    @property
    def noun(self) -> str:
        return {
            "text": "text",
            "integer": "an integer",
            "number": "a number",
            "texts": "a list of texts",
        }[self.type]


TEXT = Expect("text")
INDEX = Expect("integer", 0, INT64_MAX)
INTEGER = Expect("integer")
NUMBER = Expect("number")

_SEVERITY = Expect("text", why="the severity the rules judge by")
_PORT = {
    "severity": _SEVERITY,
    "device": Expect("text", why="the adapter the port belongs to"),
    "port": INDEX,
    "netdev": TEXT,
    "link_layer": TEXT,
    "state": TEXT,
    "phys_state": TEXT,
    "link_speed": TEXT,
    "rate_gbps": NUMBER,
    "was_rate_gbps": NUMBER,
    "normal_rate_gbps": NUMBER,
    "rate_fraction": NUMBER,
    "link_width": INTEGER,
    "normal_width": INTEGER,
    "link_downed": INTEGER,
    "increase": INTEGER,
    "counter": TEXT,
    "limit": NUMBER,
    "per_s": NUMBER,
    "since": TEXT,
}

DETAIL_FIELDS: Mapping[str, Mapping[str, Expect]] = {
    "sxid": {
        "severity": _SEVERITY,
        "sxid": Expect("integer", 0, INT64_MAX, "the SXid code"),
        "link": INDEX,
        "switch": TEXT,
        "catalog_name": TEXT,
        "error": TEXT,
    },
    "pcie_aer": {
        "severity": _SEVERITY,
        "errors": Expect("texts", why="the error names of the record"),
        "reported_by": TEXT,
        "source": TEXT,
        "layer": TEXT,
    },
    "mce": {
        "severity": _SEVERITY,
        "source": TEXT,
        "section_type": TEXT,
        "bank": Expect("integer", 0, INT64_MAX, "the machine-check bank"),
        "cpu": INDEX,
        "error": TEXT,
        "panic": TEXT,
        "memory_controller": INDEX,
    },
    "edac": {
        "severity": _SEVERITY,
        "count": Expect("integer", 0, MAX_EVENT_COUNT, "the errors this one event counts"),
        "label": TEXT,
        "memory_controller": INDEX,
    },
    **dict.fromkeys(
        ("port_down", "port_up", "port_degraded", "port_restored", "port_flap", "port_errors"),
        _PORT,
    ),
}


def details_problem(kind: str, details: object) -> tuple[Path, str] | None:
    """The first key of ``details`` that the rules cannot read for an event of ``kind``, as
    ``(path inside details, reason)``; None when every key they read is readable (or ``kind``
    is none they judge). Assumes ``details`` passed :func:`fleetwatch.storable.
    json_value_problem` on the wire; a stored one may be anything, and is checked as such."""
    fields = DETAIL_FIELDS.get(kind)
    if fields is None or details is None:
        return None
    if not isinstance(details, Mapping):
        return (), f"must be an object for an event of kind {kind!r}, not {_type(details)}"
    for key, expect in fields.items():
        value = details.get(key)
        if value is None:
            continue
        problem = _problem(value, expect)
        if problem is not None:
            inner, reason = problem
            return (key, *inner), f"{reason}; the rules read it in every {kind!r} event"
    return None


def _problem(value: object, expect: Expect) -> tuple[Path, str] | None:
    what = f" ({expect.why})" if expect.why else ""
    if expect.type == "texts":
        if not isinstance(value, list):
            return (), f"must be a list of texts{what}, not {_type(value)}"
        for i, item in enumerate(value):
            if not isinstance(item, str):
                return (i,), f"must be text{what}, not {_type(item)}"
        return None
    if expect.type == "text":
        ok = isinstance(value, str)
    elif expect.type == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        return (), f"must be {expect.noun}{what}, not {_type(value)}"
    if isinstance(value, int) and expect.low is not None and value < expect.low:
        return (), f"must be at least {expect.low}{what}, not {shown(value, 30)}"
    if isinstance(value, int) and expect.high is not None and value > expect.high:
        return (), f"must be at most {expect.high}{what}, not {shown(value, 30)}"
    return None


def _type(value: object) -> str:
    """The JSON name of ``value``'s type, as a sender would recognise it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"an integer ({shown(value, 30)})"
    if isinstance(value, float):
        return f"a number ({shown(value, 30)})"
    if isinstance(value, str):
        return f"text ({shown(value, 30)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__
