"""The Xid catalogue (``xid_catalog.csv``) as data, with per-fleet overrides.

NVIDIA's Xid Catalog is the source of truth; each CSV row says in ``source`` which source its
decision follows, and ``history rule`` where :func:`fleetwatch.rules.xid.judge_xids` can
change the table's answer from context (repeats, co-occurring Xids, Xid 154).

Columns: ``xid, mnemonic, category, severity, action, counts_against_gpu, driver_note, source``.
A code the catalogue does not list gets :meth:`XidCatalog.lookup`'s conservative default
(warning, investigate, counts against the GPU) with ``known=False``, so it is never silently
treated as harmless.

Overrides are a mapping ``xid -> partial row`` (as read from TOML, keys may be strings)::

    [xid.43]
    severity = "critical"
    action = "reset_gpu"
    counts_against_gpu = true
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Literal, cast, get_args

__all__ = [
    "ACTION_RANK",
    "CATALOG_ACTIONS",
    "SEVERITY_RANK",
    "Action",
    "Category",
    "Severity",
    "XidCatalog",
    "XidEntry",
    "unknown_entry",
]

Category = Literal[
    "hardware", "memory", "interconnect", "power_thermal", "driver_firmware", "application"
]
Severity = Literal["info", "warning", "critical", "fatal"]
# "investigate" and "drain_reset" are verdict actions the history rules produce (13/31 repeats,
# 48 with a row remap, NVML DRAIN_AND_RESET); the CSV itself uses CATALOG_ACTIONS only.
Action = Literal[
    "none",
    "restart_app",
    "investigate",
    "reset_gpu",
    "drain_reset",
    "drain_inspect",
    "reboot_node",
]
CATALOG_ACTIONS: frozenset[str] = frozenset(
    {"none", "restart_app", "reset_gpu", "reboot_node", "drain_inspect"}
)
# Order used when verdicts merge: the stronger remedy wins.
ACTION_RANK: dict[str, int] = {name: rank for rank, name in enumerate(get_args(Action))}
SEVERITY_RANK: dict[str, int] = {name: rank for rank, name in enumerate(get_args(Severity))}

_CATEGORIES = frozenset(get_args(Category))
_TEXT_FIELDS = ("mnemonic", "driver_note", "source")
_UNKNOWN_SOURCE = "FleetWatch default for codes missing from the catalogue"


@dataclass(frozen=True)
class XidEntry:
    """One catalogue row: what an Xid means and what the table says to do about it."""

    xid: int
    mnemonic: str
    category: Category
    severity: Severity
    action: Action
    counts_against_gpu: bool
    driver_note: str
    source: str
    known: bool = True  # False: not in the catalogue, conservative default

    def __post_init__(self) -> None:
        if self.xid < 0:
            raise ValueError(f"Xid {self.xid}: the code must be >= 0")
        if self.category not in _CATEGORIES:
            raise ValueError(f"Xid {self.xid}: category {self.category!r} not in {_CATEGORIES}")
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"Xid {self.xid}: severity {self.severity!r} not in {SEVERITY_RANK}")
        if self.action not in ACTION_RANK:
            raise ValueError(f"Xid {self.xid}: action {self.action!r} not in {ACTION_RANK}")
        if self.category == "application" and self.counts_against_gpu:
            # An application fault says nothing about the GPU on its own; only history may say so.
            raise ValueError(f"Xid {self.xid}: an application Xid cannot count against the GPU")


def unknown_entry(xid: int) -> XidEntry:
    """The conservative default for a code the catalogue does not list."""
    return XidEntry(
        xid=xid,
        mnemonic=f"unknown Xid {xid}",
        category="driver_firmware",
        severity="warning",
        action="investigate",
        counts_against_gpu=True,
        driver_note="not in the catalogue: check NVIDIA's Xid Catalog for this driver",
        source=_UNKNOWN_SOURCE,
        known=False,
    )


class XidCatalog:
    """Xid code -> :class:`XidEntry`, with fleet overrides applied; lookups never fail."""

    def __init__(self, entries: Mapping[int, XidEntry]) -> None:
        self._entries = dict(sorted(entries.items()))

    @classmethod
    def load(cls, overrides: Mapping[int | str, Mapping[str, object]] | None = None) -> XidCatalog:
        """The catalogue shipped with FleetWatch, with ``overrides`` applied on top."""
        text = resources.files("fleetwatch.rules").joinpath("xid_catalog.csv").read_text("utf-8")
        catalog = cls.from_csv(text)
        return catalog.with_overrides(overrides) if overrides else catalog

    @classmethod
    def from_csv(cls, text: str) -> XidCatalog:
        """Parse catalogue CSV text; a bad row raises ``ValueError`` naming the line."""
        entries: dict[int, XidEntry] = {}
        for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            try:
                entry = _entry_from_row(row)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"xid_catalog.csv line {line}: {exc}") from exc
            if entry.xid in entries:
                raise ValueError(f"xid_catalog.csv line {line}: Xid {entry.xid} listed twice")
            entries[entry.xid] = entry
        return cls(entries)

    def with_overrides(self, overrides: Mapping[int | str, Mapping[str, object]]) -> XidCatalog:
        """A new catalogue where each ``xid -> partial row`` replaces the named columns."""
        allowed = {f.name for f in fields(XidEntry)} - {"xid", "known"}
        entries = dict(self._entries)
        for key, changes in overrides.items():
            xid = int(key)
            unknown = set(changes) - allowed
            if unknown:
                raise ValueError(f"override for Xid {xid}: unknown columns {sorted(unknown)}")
            base = entries.get(xid) or replace(unknown_entry(xid), known=True)
            values: dict[str, object] = {
                name: _coerce(name, value) for name, value in changes.items()
            }
            values["source"] = f"{changes.get('source', base.source)}; fleet override"
            entries[xid] = replace(base, **values)  # type: ignore[arg-type]
        return XidCatalog(entries)

    def lookup(self, xid: int) -> XidEntry:
        """The row for ``xid``, or the conservative unknown default (``known=False``)."""
        entry = self._entries.get(xid)
        return entry if entry is not None else unknown_entry(xid)

    def __contains__(self, xid: object) -> bool:
        return xid in self._entries

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


def _entry_from_row(row: Mapping[str, str]) -> XidEntry:
    return XidEntry(
        xid=int(row["xid"]),
        mnemonic=row["mnemonic"].strip(),
        category=cast(Category, row["category"].strip()),
        severity=cast(Severity, row["severity"].strip()),
        action=cast(Action, row["action"].strip()),
        counts_against_gpu=_bool(row["counts_against_gpu"]),
        driver_note=row["driver_note"].strip(),
        source=row["source"].strip(),
    )


def _coerce(name: str, value: object) -> object:
    if name == "counts_against_gpu":
        return value if isinstance(value, bool) else _bool(str(value))
    if not isinstance(value, str):
        raise ValueError(f"override column {name!r} needs a string, got {value!r}")
    return value.strip() if name in _TEXT_FIELDS else value.strip().lower()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")
