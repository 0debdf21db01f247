"""fleetwatch.storable and the server's locator: which values no database can store, and where."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetwatch.server.ingest.checks import locate_unreadable
from fleetwatch.storable import json_value_problem, shown, text_problem


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("ok", None),
        ("emoji \U0001f600 and ü", None),
        ("a\x00b", "NUL"),
        ("\ud800", "surrogate"),
        ("tail \udfff", "surrogate"),
    ],
)
def test_text_problem_names_the_reason(value: str, reason: str | None) -> None:
    problem = text_problem(value)
    assert (problem is None) if reason is None else (reason in (problem or ""))


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": 1, "b": [1.5, "x", None, True, {"c": -(2**63)}]}, None),
        ({"a": [0, {"b": "x\x00"}]}, ("a", 1, "b")),
        ({"ok": 1, "k\x00": 1}, ("k\x00", "[key]")),
        ({"n": 2**63}, ("n",)),
        ({"n": -(2**63) - 1}, ("n",)),
        ({"f": [float("nan")]}, ("f", 0)),
        ({"f": {"g": float("-inf")}}, ("f", "g")),
    ],
)
def test_json_value_problem_gives_the_path(value: Any, path: tuple[Any, ...] | None) -> None:
    problem = json_value_problem(value)
    assert (problem is None) if path is None else (problem is not None and problem[0] == path)


def test_json_value_problem_walks_deep_values_without_recursion() -> None:
    deep: Any = "x\x00"
    for _ in range(5000):
        deep = [deep]
    problem = json_value_problem({"d": deep})
    assert problem is not None and len(problem[0]) == 5001


def test_shown_cuts_long_values() -> None:
    assert shown("short") == "'short'"
    cut = shown("z" * 10_000)
    assert len(cut) < 100 and "10002 characters" in cut


def test_locate_unreadable_finds_surrogates_and_huge_integers() -> None:
    body = (
        '{"node": {"labels": {"rack": "\\ud800"}}, "events": [{"details": {"\\udc00": 1, '
        '"n": ' + "9" * 5000 + "}}]}"
    ).encode()
    found = {tuple(d["loc"]): d["msg"] for d in locate_unreadable(body)}
    assert "surrogate" in found[("body", "node", "labels", "rack")]
    # A key's lone surrogate is shown escaped: a UTF-8 answer cannot carry it.
    assert "surrogate" in found[("body", "events", 0, "details", "\\udc00", "[key]")]
    assert "5000 digits" in found[("body", "events", 0, "details", "n")]


@pytest.mark.parametrize("body", [b'{"a": ', b"\xff\xfe", b"[" * 100_000, json.dumps({}).encode()])
def test_locate_unreadable_finds_nothing_in_what_it_cannot_explain(body: bytes) -> None:
    assert locate_unreadable(body) == []
