"""How a sample's fields are stored: the smallest type that holds every value the wire accepts,
exactly or to the precision the source has.

Samples are stored in blocks (:mod:`fleetwatch.server.db.sample_blocks`), each field in its
storage type; a value that type cannot hold would fail the batch (and the agent would retry it
forever), so each field gets the narrowest type that cannot refuse a value the wire accepted:

- **int8**: the counters (ECC, retired pages, remapped rows, NVLink, PCIe replays, energy,
  violation times) and ``clocks_event_reasons``. The wire takes 0..2^63-1 and they are
  cumulative: ``energy_mj`` passes 2^31 within a day at 700 W, and 2^24 (the last integer a
  float32 holds exactly) within a minute.
- **float4** (24-bit mantissa, 7 significant digits): temperatures, power, power limit,
  clocks, fan, GPU and copy utilisation. The wire bounds them (50,000 at most) and the sources
  report integers (degrees, MHz, percent) or milliwatts (700.123 W): 7 digits hold them all.
- **float8**: ``fb_used_mib`` and ``fb_total_mib``. The wire has no upper bound for them; a
  float32 overflows above 3.4e38 and would fail the batch.
- **int2**: ``pcie_link_gen``, ``pcie_link_width``, ``gpu_recovery_action``, integers the wire
  bounds at 16, 64 and 255.
- **bool**: the three flags.

The names are PostgreSQL's (:func:`copy_type`), from the days of a column per field.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import REAL, BigInteger, Boolean, Float, SmallInteger
from sqlalchemy.types import TypeEngine

from fleetwatch.telemetry import SAMPLE_FIELDS, FieldSpec

__all__ = ["SAMPLE_STORAGE_ORDER", "copy_type", "python_type", "storage_type", "storage_width"]

_SPECS = {spec.name: spec for spec in SAMPLE_FIELDS}
# Integers the wire bounds well below 2^15 (pcie_link_gen <= 16, width <= 64, action <= 255).
_SMALL_INTEGER_GAUGES = frozenset({"pcie_link_gen", "pcie_link_width", "gpu_recovery_action"})
# Gauges the wire leaves unbounded above: only a double holds every finite value it accepts.
_UNBOUNDED_GAUGES = frozenset({"fb_used_mib", "fb_total_mib"})


def storage_type(spec: FieldSpec) -> TypeEngine[Any]:
    """The column type of one canonical field (see the module's table for the reasons)."""
    if spec.kind == "flag":
        return Boolean()
    if spec.is_integer:
        return BigInteger()
    if spec.name in _SMALL_INTEGER_GAUGES:
        return SmallInteger()
    if spec.name in _UNBOUNDED_GAUGES:
        return Float()
    return REAL()


def python_type(name: str) -> type:
    """The Python type of a stored value of field ``name`` (int, float or bool)."""
    kind: type = storage_type(_SPECS[name]).python_type
    return kind


def copy_type(spec: FieldSpec) -> str:
    """The PostgreSQL type name of the field's column, as binary COPY must be told it."""
    kind = storage_type(spec)
    if isinstance(kind, Boolean):
        return "bool"
    if isinstance(kind, SmallInteger):
        return "int2"
    if isinstance(kind, BigInteger):
        return "int8"
    return "float4" if isinstance(kind, REAL) else "float8"


def storage_width(spec: FieldSpec) -> int:
    """Bytes a value of this field takes in a PostgreSQL row (also its alignment)."""
    kind = storage_type(spec)
    if isinstance(kind, Boolean):
        return 1
    if isinstance(kind, SmallInteger):
        return 2
    if isinstance(kind, REAL):
        return 4
    return 8


SAMPLE_STORAGE_ORDER: tuple[str, ...] = tuple(
    spec.name for spec in sorted(SAMPLE_FIELDS, key=lambda spec: -storage_width(spec))
)
