"""The msgspec structs of the ingest hot path mirror the wire format's pydantic models.

Same fields in the same order, the same defaults, the same kinds of value, and the same bounds
(read from pydantic's JSON schema); a field added to :mod:`fleetwatch.telemetry` and not here
fails this test before it could be silently dropped (the structs forbid unknown fields, so such a
batch would only ever take the slow path, but the speed would be lost without a word).
"""

from __future__ import annotations

from typing import Any

import msgspec.inspect as mi
import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from fleetwatch.server.ingest.batch_structs import (
    SAMPLE_UUID_PATTERN,
    BatchStruct,
    EventStruct,
    GpuStruct,
    NodeStruct,
    SampleStruct,
    python_pattern,
)
from fleetwatch.telemetry import Batch, Event, GpuIdentity, GpuSample, NodeInfo

PAIRS = [
    (Batch, BatchStruct),
    (NodeInfo, NodeStruct),
    (GpuIdentity, GpuStruct),
    (GpuSample, SampleStruct),
    (Event, EventStruct),
]
_KINDS = {
    "integer": mi.IntType,
    "number": mi.FloatType,
    "boolean": mi.BoolType,
    "string": mi.StrType,
    "object": mi.DictType,
    "array": mi.ListType,
}
_BOUNDS = {
    "exclusiveMinimum": "gt",
    "minimum": "ge",
    "exclusiveMaximum": "lt",
    "maximum": "le",
    "minLength": "min_length",
    "maxLength": "max_length",
}


def _default(model: type[BaseModel], name: str) -> Any:
    field = model.model_fields[name]
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _struct_default(field: mi.Field) -> Any:
    if field.required:
        return PydanticUndefined
    if field.default_factory is not mi.NODEFAULT:
        return field.default_factory()
    return field.default


@pytest.mark.parametrize(("model", "struct"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_structs_have_the_models_fields_defaults_kinds_and_bounds(
    model: type[BaseModel], struct: type[Any]
) -> None:
    schema = model.model_json_schema()
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType) and info.forbid_unknown_fields
    assert [f.name for f in info.fields] == list(model.model_fields)
    for field in info.fields:
        assert _struct_default(field) == _default(model, field.name), field.name
        prop = schema["properties"][field.name]
        arms = prop.get("anyOf", [prop])
        nullable = any(a.get("type") == "null" for a in arms)
        arm = next(a for a in arms if a.get("type") != "null")
        types = field.type.types if isinstance(field.type, mi.UnionType) else (field.type,)
        assert (mi.NoneType() in types) == nullable, field.name
        (kind,) = [t for t in types if not isinstance(t, mi.NoneType)]
        if arm.get("format") == "date-time":
            # Decoded as text, parsed by fleetwatch.server.ingest.wire_time (see batch_structs).
            assert isinstance(kind, mi.StrType), field.name
            continue
        if "$ref" in arm and field.name == "mig":
            # A MIG layout is left to pydantic: the fast path declines a batch declaring one.
            assert isinstance(kind, mi.DictType), field.name
            continue
        if "$ref" in arm:
            assert isinstance(kind, mi.StructType), field.name
            continue
        assert isinstance(kind, _KINDS[arm["type"]]), field.name
        if arm["type"] == "array" and field.name == "ports":
            # Adapter ports are left to pydantic: the fast path declines a batch carrying any.
            assert isinstance(kind.item_type, mi.DictType), field.name
            continue
        if arm["type"] == "array":
            assert isinstance(kind.item_type, mi.StructType), field.name
        if arm["type"] == "object":
            # labels' rules live in a pydantic validator, not the schema: the decoder tests
            # (test_batch_decoder.py) compare them; details are free-form.
            continue
        if field.name == "uuid" and model is GpuSample:
            # Checked once per distinct uuid of a batch by the decoder, with the same pattern.
            assert kind.pattern is None
            assert python_pattern(arm["pattern"]) == SAMPLE_UUID_PATTERN
            continue
        for bound, attr in _BOUNDS.items():
            if hasattr(kind, attr):
                assert getattr(kind, attr) == arm.get(bound), (field.name, attr)
        if isinstance(kind, mi.StrType):
            expected = arm.get("pattern")
            assert kind.pattern == (expected and python_pattern(expected)), field.name


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"^[a-z]+$", "node", True),
        (r"^[a-z]+$", "node\n", False),  # Rust's $ (pydantic) is the end: \Z in Python
        (r"^a\$", "a$", True),
    ],
)
def test_python_pattern_ends_where_pydantic_ends(pattern: str, text: str, matches: bool) -> None:
    import re

    assert (re.search(python_pattern(pattern), text) is not None) is matches
