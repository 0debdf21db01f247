"""Reading lifetime CSVs: column mapping, location pattern, end-kind rule, refused lines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetwatch.errors import InvalidInput
from fleetwatch.inventory import ColumnMap, ImportSummary, parse_utc, read_lifetimes

TITAN = """SN,location,insert,remove,duration,out,event
0001,c11-2c1s4n1,2017-04-09 21:36:19,2019-08-01 20:07:33,1,FALSE,
0002,c9-3c1s2n1,2014-01-21 10:28:50,2016-07-19 20:15:20,1,TRUE,DBE
0003,c6-2c1s2n0,2014-01-21 10:28:50,2016-02-21 04:54:23,1,TRUE,
0004,c6-2c1s2n0,2016-02-22 00:00:00,,,,
0005,c8-6c1s0n1,,2016-04-26 18:35:50,,,DBE
"""


def _read(text: str, **kwargs: object) -> tuple[list, ImportSummary]:  # type: ignore[type-arg]
    summary = ImportSummary()
    records = list(read_lifetimes(text.splitlines(keepends=True), summary=summary, **kwargs))  # type: ignore[arg-type]
    return records, summary


def test_inventory_reads_titan_rows_with_the_end_kind_rule() -> None:
    records, summary = _read(TITAN)
    by_serial = {r.serial: r for r in records}
    assert (summary.rows, summary.accepted, summary.rejected_count) == (5, 4, 1)
    # out=FALSE and no event: did not leave service; removed_at kept as given.
    assert by_serial["0001"].end_kind is None
    assert by_serial["0001"].removed_at == datetime(2019, 8, 1, 20, 7, 33, tzinfo=UTC)
    assert by_serial["0001"].evidence == {
        "location_parts": {"col": 11, "row": 2, "cage": 1, "slot": 4, "node": 1},
        "out": False,
    }
    assert (by_serial["0002"].end_kind, by_serial["0002"].cause) == ("failure", "DBE")
    assert (by_serial["0003"].end_kind, by_serial["0003"].cause) == ("retirement", None)
    assert by_serial["0004"].removed_at is None and by_serial["0004"].end_kind is None
    assert by_serial["0002"].installed_at == datetime(2014, 1, 21, 10, 28, 50, tzinfo=UTC)
    assert by_serial["0002"].line == 3
    assert summary.rejected[0].line == 6
    assert "'insert'" in summary.rejected[0].reason


def test_inventory_without_out_column_retires_removed_units() -> None:
    text = "SN,location,insert,remove,event\nA,c1-1c0s0n0,2020-01-01,2021-01-01,\n"
    (record,), _ = _read(text)
    assert record.end_kind == "retirement"
    assert record.evidence == {
        "location_parts": {"col": 1, "row": 1, "cage": 0, "slot": 0, "node": 0}
    }


def test_inventory_column_mapping_and_custom_pattern() -> None:
    text = (
        "serial_number,slot,installed,removed,failure\n"
        "S1,rack7-u12,2020-01-01T00:00:00+02:00,2020-06-01T00:00:00Z,Xid 79\n"
    )
    columns = ColumnMap.from_pairs(
        [
            "serial=serial_number",
            "location=slot",
            "inserted=installed",
            "removed=removed",
            "event=failure",
            "out=",
        ]
    )
    (record,), summary = _read(
        text, columns=columns, location_pattern=r"rack(?P<rack>\d+)-u(?P<unit>\w+)"
    )
    assert summary.rejected_count == 0
    assert record.installed_at == datetime(2019, 12, 31, 22, 0, tzinfo=UTC)
    assert (record.end_kind, record.cause) == ("failure", "Xid 79")
    assert record.evidence == {"location_parts": {"rack": 7, "unit": 12}}


def test_inventory_empty_pattern_keeps_location_unparsed() -> None:
    text = "SN,location,insert,remove,event\nA,anywhere,2020-01-01,,\n"
    (record,), _ = _read(text, location_pattern="")
    assert record.location == "anywhere" and record.evidence is None


def test_inventory_bad_rows_are_reported_with_line_numbers() -> None:
    text = (
        "SN,location,insert,remove,out,event\n"
        "A,c1-1c0s0n0,2020-01-01,2021-01-01,TRUE,\n"  # line 2: fine
        "B,c1-1c0s0n0,yesterday,2021-01-01,TRUE,\n"  # 3: bad install time
        "C,c1-1c0s0n0,2020-01-01,2021-13-01,TRUE,\n"  # 4: bad removal time
        "D,nowhere,2020-01-01,,,\n"  # 5: location off the pattern
        ",c1-1c0s0n0,2020-01-01,,,\n"  # 6: no serial
        "E,c1-1c0s0n0,2021-01-01,2020-01-01,TRUE,\n"  # 7: removed before installed
        "F,c1-1c0s0n0,2020-01-01\n"  # 8: too few fields
        "G,c1-1c0s0n0,2020-01-01,,,,extra\n"  # 9: too many fields
        "H,c1-1c0s0n0,2020-01-01,2021-01-01,maybe,\n"  # 10: out neither true nor false
    )
    records, summary = _read(text)
    assert [r.serial for r in records] == ["A"]
    assert summary.rows == 9 and summary.rejected_count == 8
    lines = {r.line: r.reason for r in summary.rejected}
    assert sorted(lines) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert "'yesterday'" in lines[3]
    assert "'2021-13-01'" in lines[4]
    assert "does not match pattern" in lines[5]
    assert "serial" in lines[6]
    assert "before installed" in lines[7]
    assert "number of fields" in lines[8] and "number of fields" in lines[9]
    assert "'maybe'" in lines[10]


def test_inventory_summary_keeps_only_the_first_rejected() -> None:
    text = "SN,location,insert,remove,event\n" + "A,,bad,,\n" * 50
    summary = ImportSummary(keep_rejected=3)
    assert list(read_lifetimes(text.splitlines(keepends=True), summary=summary)) == []
    assert summary.rejected_count == 50
    assert [r.line for r in summary.rejected] == [2, 3, 4]


@pytest.mark.parametrize(
    ("text", "needle"),
    [("", "empty"), ("serial,insert,remove\n1,2020-01-01,\n", "'SN' (serial)")],
)
def test_inventory_refuses_files_without_the_mapped_header(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _read(text)
    assert needle in str(caught.value)


@pytest.mark.parametrize(
    ("pairs", "needle"),
    [(["serial"], "FIELD=COLUMN"), (["colour=SN"], "colour"), (["serial="], "required")],
)
def test_inventory_column_map_refuses_bad_pairs(pairs: list[str], needle: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        ColumnMap.from_pairs(pairs)
    assert needle in str(caught.value)


def test_inventory_refuses_a_bad_pattern() -> None:
    with pytest.raises(InvalidInput) as caught:
        _read(TITAN, location_pattern="c(?P<col")
    assert "not a regular expression" in str(caught.value)


def test_inventory_parse_utc_converts_offsets_and_assumes_utc() -> None:
    assert parse_utc("2020-01-01 12:00:00") == datetime(2020, 1, 1, 12, tzinfo=UTC)
    assert parse_utc("2020-01-01T12:00:00-05:00") == datetime(2020, 1, 1, 17, tzinfo=UTC)
    assert parse_utc("2020-01-01T12:00:00Z").tzinfo is UTC
