"""What every value on the wire must be so that both databases can store it.

PostgreSQL ``text`` and ``jsonb`` cannot hold a NUL character, no UTF-8 encoder can write a lone
UTF-16 surrogate (``"\\ud800"`` in JSON), an integer column holds at most a signed 64-bit value,
and JSON (and ``jsonb``) has no NaN or Infinity. SQLite takes most of these silently and gives
back something else (NaN reads back as null), so the wire format refuses them for both: a value
that one database would store differently from the other is refused at the edge, naming the field.

The fixed fields use :data:`Text` and :data:`INT64_MAX` in their declarations; free-form JSON
(an event's ``details``) is walked by :func:`json_value_problem`.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "STORABLE_TEXT",
    "Text",
    "json_value_problem",
    "shown",
    "text_problem",
]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(value: object, most: int = 60) -> str:
    """``repr(value)``, cut to ``most`` characters: error messages never echo a megabyte back."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which cannot be stored as text; remove it"
    match = _SURROGATE.search(value)
    if match is not None:
        return (
            f"contains a lone UTF-16 surrogate (\\u{ord(match.group()):04x}), which is not "
            "valid Unicode text; send the character itself, or a complete surrogate pair"
        )
    return None


def _check_text(value: object) -> object:
    problem = text_problem(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(problem)
    return value


STORABLE_TEXT = BeforeValidator(_check_text)
"""Refuses a string with a NUL or a lone surrogate. With a length limit, put it after the limit:
``Annotated[str, Field(max_length=64), STORABLE_TEXT]`` keeps the limit on the str schema and its
usual "at most 64 characters" message."""

Text = Annotated[str, STORABLE_TEXT]
"""A string any database can store: no NUL, no lone surrogate."""


def _number_problem(value: int | float) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return None
        return f"integer {shown(value, 30)} is out of range (a signed 64-bit integer at most)"
    if math.isfinite(value):
        return None
    return f"{value} is not a finite number (JSON has no NaN or Infinity)"


def json_value_problem(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """The first value inside ``value`` (free-form JSON) that cannot be stored, or None.

    Returns ``(path, reason)``; a problem in an object key ends its path with ``"[key]"``, as
    pydantic's own locations do. Iterative, so that depth costs no Python stack.
    """
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, int | float):
            problem = _number_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, dict):
            for key in item:
                problem = text_problem(key) if isinstance(key, str) else None
                if problem is not None:
                    return (*path, key, "[key]"), problem
            pending.extend(((*path, key), inner) for key, inner in reversed(item.items()))
        elif isinstance(item, list):
            pending.extend(((*path, i), inner) for i, inner in reversed(list(enumerate(item))))
    return None
