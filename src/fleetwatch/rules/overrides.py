"""The fleet's own rules: the Xid catalogue and health thresholds with a TOML file's overrides.

The file (server setting ``rules_file``) has up to two tables: ``[xid]`` overrides catalogue entries
(:meth:`XidCatalog.load`) and ``[health]`` thresholds (:meth:`HealthThresholds.from_mapping`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog

__all__ = ["load_rules"]


def load_rules(rules_file: Path | None) -> tuple[XidCatalog, HealthThresholds]:
    """The Xid catalogue and health thresholds, with the overrides from ``rules_file``."""
    if rules_file is None:
        return XidCatalog.load(), HealthThresholds()
    data = tomllib.loads(rules_file.read_text("utf-8"))
    unknown = set(data) - {"xid", "health"}
    if unknown:
        raise ValueError(f"{rules_file}: unknown table(s) {sorted(unknown)}")
    return XidCatalog.load(data.get("xid")), HealthThresholds.from_mapping(data.get("health"))
