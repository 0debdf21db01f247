"""The shipped Xid catalogue: types, coverage of the reference table, lookups and overrides."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fleetwatch.rules.xid_catalog import CATALOG_ACTIONS, XidCatalog, XidEntry, unknown_entry

CATEGORIES = {
    "hardware",
    "memory",
    "interconnect",
    "power_thermal",
    "driver_firmware",
    "application",
}
SEVERITIES = {"info", "warning", "critical", "fatal"}


def _reference_codes(shared_dir: Path) -> set[int]:
    """Every Xid in section 1's table of health-signals.md, with ranges and pairs expanded."""
    text = (shared_dir / "reference" / "health-signals.md").read_text(encoding="utf-8")
    section = text.split("## 1.", 1)[1].split("\n## ", 1)[0]
    codes: set[int] = set()
    for line in section.splitlines():
        cell = re.match(r"^\|\s*(\d[0-9/–-]*)\s*\|", line)
        if cell is None:
            continue
        for part in cell.group(1).split("/"):
            low, _, high = part.replace("–", "-").partition("-")
            codes.update(range(int(low), int(high or low) + 1))
    return codes


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return XidCatalog.load()


def test_xid_catalog_rows_have_valid_types(catalog: XidCatalog) -> None:
    assert len(catalog) > 50
    for entry in catalog:
        assert isinstance(entry.xid, int)
        assert isinstance(entry.counts_against_gpu, bool)
        assert entry.category in CATEGORIES
        assert entry.severity in SEVERITIES
        assert entry.action in CATALOG_ACTIONS
        assert entry.mnemonic and entry.driver_note and entry.source
        assert entry.known


def test_xid_catalog_covers_reference_table(catalog: XidCatalog, shared_dir: Path) -> None:
    codes = _reference_codes(shared_dir)
    assert {13, 48, 56, 57, 58, 144, 150, 162, 163, 171, 172} <= codes  # the parse itself works
    assert codes - {e.xid for e in catalog} == set()


def test_xid_catalog_application_xids_never_count(catalog: XidCatalog) -> None:
    apps = [e for e in catalog if e.category == "application"]
    assert {13, 31, 43, 137} <= {e.xid for e in apps}
    assert not any(e.counts_against_gpu for e in apps)


@pytest.mark.parametrize(
    ("xid", "action", "severity", "counts"),
    [
        (79, "reboot_node", "fatal", True),
        (48, "reset_gpu", "critical", True),
        (13, "restart_app", "warning", False),
        (63, "none", "info", True),
        (95, "reset_gpu", "critical", True),
        (74, "drain_inspect", "critical", True),
        (45, "none", "info", False),
    ],
)
def test_xid_catalog_lookup_follows_nvidia(
    catalog: XidCatalog, xid: int, action: str, severity: str, counts: bool
) -> None:
    entry = catalog.lookup(xid)
    assert (entry.action, entry.severity, entry.counts_against_gpu) == (action, severity, counts)
    assert entry.source.startswith("NVIDIA catalog")


def test_xid_catalog_notes_driver_applicability(catalog: XidCatalog) -> None:
    assert "unused on A100+" in catalog.lookup(56).driver_note
    assert "B100/GB200 only" in catalog.lookup(147).driver_note
    assert "history rule" in catalog.lookup(48).source


def test_xid_catalog_unknown_code_is_conservative(catalog: XidCatalog) -> None:
    entry = catalog.lookup(9999)
    assert not entry.known
    assert (entry.severity, entry.action, entry.counts_against_gpu) == (
        "warning",
        "investigate",
        True,
    )
    assert "unknown" in entry.mnemonic
    assert 9999 not in catalog


def test_xid_catalog_overrides_from_toml(catalog: XidCatalog) -> None:
    fleet = tomllib.loads(
        """
        [xid.43]
        severity = "critical"
        action = "reset_gpu"
        category = "driver_firmware"
        counts_against_gpu = true
        [xid.63]
        counts_against_gpu = "false"
        """
    )
    changed = catalog.with_overrides(fleet["xid"])
    promoted = changed.lookup(43)
    assert (promoted.severity, promoted.action, promoted.counts_against_gpu) == (
        "critical",
        "reset_gpu",
        True,
    )
    assert promoted.source.endswith("fleet override")
    assert promoted.mnemonic == catalog.lookup(43).mnemonic  # untouched columns kept
    assert changed.lookup(63).counts_against_gpu is False
    assert catalog.lookup(43).action == "none"  # the original is not modified
    assert XidCatalog.load({43: {"action": "reset_gpu"}}).lookup(43).action == "reset_gpu"


def test_xid_catalog_override_can_add_a_code(catalog: XidCatalog) -> None:
    added = catalog.with_overrides({9000: {"mnemonic": "vendor test", "severity": "info"}})
    entry = added.lookup(9000)
    assert entry.known and entry.severity == "info" and entry.mnemonic == "vendor test"


@pytest.mark.parametrize(
    "override",
    [
        {"colour": "red"},
        {"action": "explode"},
        {"severity": 3},
        {"counts_against_gpu": "maybe"},
    ],
)
def test_xid_catalog_bad_override_raises(catalog: XidCatalog, override: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        catalog.with_overrides({48: override})


def test_xid_catalog_application_cannot_count() -> None:
    with pytest.raises(ValueError, match="application"):
        XidEntry(13, "x", "application", "warning", "none", True, "all", "test")


def test_xid_catalog_from_csv_rejects_bad_rows() -> None:
    header = "xid,mnemonic,category,severity,action,counts_against_gpu,driver_note,source\n"
    row = "48,DBE,memory,critical,reset_gpu,true,all,test\n"
    assert len(XidCatalog.from_csv(header + row)) == 1
    with pytest.raises(ValueError, match="line 3: Xid 48 listed twice"):
        XidCatalog.from_csv(header + row + row)
    with pytest.raises(ValueError, match="line 2"):
        XidCatalog.from_csv(header + row.replace("memory", "plumbing"))


def test_xid_catalog_unknown_entry_marked() -> None:
    assert unknown_entry(7).source.startswith("FleetWatch default")
