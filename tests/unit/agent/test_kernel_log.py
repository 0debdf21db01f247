from __future__ import annotations

import csv
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

import pytest

from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.parsers.kernel_log import (
    monotonic_seconds,
    parse_kernel_line,
    parse_kernel_log,
)
from fleetwatch.telemetry import Event

HINT = 2021  # syslog stamps carry no year; this one must show up in their ts


def _utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0, usec: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, sec, usec, tzinfo=UTC)


class Expected(NamedTuple):
    kind: str
    xid: int | None
    pci_bus_id: str
    pid: int | None
    process: str | None
    ts: datetime | None
    message: str


ROW_REMAP = "Row Remapper: New row marked for remapping, reset gpu to activate"
CONTAINED = "Contained: SM (0x1). RST: No, D-RST: No"
OFF_BUS = "GPU has fallen off the bus."

# One entry per row of xid_lines_curated.tsv (= line of xid_lines_curated.log), read by hand.
# fmt: off
CURATED: list[Expected | None] = [
    Expected(
        "xid", 48, "0000:19:00.0", None, None, _utc(2024, 11, 15, 12, 2, 3, 470068),
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "physAddr 0x12bac1c3e0 partition 2, subpartition 1.",
    ),
    Expected(
        "xid", 63, "0000:19:00.0", None, None, _utc(2024, 11, 15, 12, 2, 3, 498753),
        "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
    ),
    Expected(
        "xid", 94, "0000:19:00.0", None, None, _utc(2024, 11, 15, 12, 2, 3, 506595), CONTAINED
    ),
    Expected(
        "xid", 94, "0000:19:00.0", 1248209, "python3.10", _utc(2024, 11, 15, 12, 2, 3, 521616),
        "Ch 00000008",
    ),
    Expected(
        "xid", 13, "0000:38:00.0", None, None, _utc(2025, 1, 21, 2, 21, 33, 498559),
        "Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address",
    ),
    Expected(
        "xid", 13, "0000:38:00.0", None, None, _utc(2025, 1, 21, 2, 21, 33, 498648),
        "Graphics SM Global Exception on (GPC 8, TPC 5, SM 0): Multiple Warp Errors",
    ),
    Expected(
        "xid", 13, "0000:38:00.0", None, None, _utc(2025, 1, 21, 2, 21, 33, 498749),
        "Graphics Exception: ESR 0x546f30=0x124000e 0x546f34=0x24 0x546f28=0xf81eb60 "
        "0x546f2c=0x1174",
    ),
    Expected(
        "xid", 43, "0000:38:00.0", 2815167, "pt_main_thread", _utc(2025, 1, 21, 2, 21, 33, 502278),
        "Ch 00000008",
    ),
    Expected(
        "xid", 13, "0000:cb:00.0", None, None, _utc(2024, 8, 30, 11, 43, 9),
        "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    ),
    Expected(
        "xid", 109, "0000:cb:00.0", 1797828, "pt_main_thread", _utc(2024, 8, 30, 11, 43, 14),
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    ),
    Expected(
        "xid", 31, "0000:cb:00.0", 626486, "pt_main_thread", _utc(2024, 8, 31, 7, 6, 3),
        "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_14 faulted @ "
        "0x7f2f_cca58000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ),
    Expected("xid", 79, "0000:91:00.0", None, None, None, OFF_BUS),  # [uptime] only: no ts
    Expected("gpu_lost", None, "0000:91:00.0", None, None, None, OFF_BUS),
    None,  # NVRM: GPU at PCI:...: GPU-<uuid> (a mapping, not an event)
    None,  # NVSwitch SXid
    None,  # NVSwitch SXid continuation
    Expected(
        "xid", 63, "0000:51:00.0", 4549, None, _utc(HINT, 1, 1, 9, 30, 56), ROW_REMAP + "."
    ),
    Expected(
        "xid", 64, "0000:0b:00.0", 3776851, None, _utc(HINT, 1, 19, 8, 22, 56),
        "Row Remapper Error: (0x000000039a559380) - All reserved rows for bank are remapped",
    ),
    Expected("xid", 94, "0000:0b:00.0", 3776851, None, _utc(HINT, 1, 19, 8, 22, 56), CONTAINED),
    Expected("xid", 63, "0000:10:1c.0", 1896, None, None, ROW_REMAP + "."),
    Expected("xid", 79, "0000:ca:00.0", None, None, None, OFF_BUS),
    None,  # k8s-device-plugin "XidCriticalError: Xid=48 ..." is no kernel line
    Expected(
        "xid", 13, "0000:b5:00.0", None, None, None,
        "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    ),
    Expected(
        "xid", 13, "0002:00:00.0", 2519562, "python3", None,
        "Graphics Exception: ChID 000c, Class 0000cbc0, Offset 00000000, Data 00000000",
    ),
    None,  # PCI -> UUID mapping line
    None,  # board serial line
    Expected("xid", 63, "0000:10:1c.0", 1850, None, _utc(HINT, 5, 19, 7, 8, 57), ROW_REMAP),
    Expected("xid", 45, "0000:02:00.0", 1300, None, _utc(HINT, 11, 22, 14, 56, 47), "Ch 00000001"),
    Expected("xid", 45, "0000:02:00.0", 1505, None, _utc(HINT, 11, 22, 14, 56, 49), "Ch 00000011"),
    Expected(
        "xid", 48, "0000:55:00.0", 2187734, "python", _utc(HINT, 8, 10, 15, 36, 5),
        "channel 0x00000002",
    ),
    Expected(
        "xid", 63, "0000:55:00.0", 2187734, "python", _utc(HINT, 8, 10, 15, 36, 5),
        "Row Remapper: New row (0x0000000e9b9107e0) marked for remapping, reset gpu to activate.",
    ),
    Expected(
        "xid", 154, "0000:55:00.0", None, None, _utc(HINT, 8, 10, 15, 36, 5),
        "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
    ),
    Expected(
        "xid", 62, "0000:01:00.0", None, None, None,
        "023f0f30 00000000 00000000 202c0ffe 202bc4b6 2029bdb6 202bccb8 20297b2a",
    ),
    Expected("xid", 45, "0000:01:00.0", 9684, "python", None, "channel 0x00000015"),
    None,  # PCI -> UUID mapping line
]
# fmt: on


def _kernel_logs(fixtures_dir: Path) -> Path:
    return fixtures_dir / "kernel_logs"


def _curated_rows(fixtures_dir: Path) -> list[dict[str, str]]:
    with (_kernel_logs(fixtures_dir) / "xid_lines_curated.tsv").open(newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def _actual(event: KernelEvent | None) -> Expected | None:
    if event is None:
        return None
    assert event.pci_bus_id is not None
    return Expected(
        event.kind, event.xid, event.pci_bus_id, event.pid, event.process, event.ts, event.message
    )


def test_curated_tsv_matches_log_and_table(fixtures_dir: Path) -> None:
    rows = _curated_rows(fixtures_dir)
    log = (_kernel_logs(fixtures_dir) / "xid_lines_curated.log").read_text().splitlines()
    assert [row["line"] for row in rows] == log
    assert len(rows) == len(CURATED) == 35


@pytest.mark.parametrize("index", range(len(CURATED)))
def test_kernel_line_curated_oracle(fixtures_dir: Path, index: int) -> None:
    row = _curated_rows(fixtures_dir)[index]
    event = parse_kernel_line(row["line"], year_hint=HINT)

    # The TSV's own xid column: a number, "(none)", "SXid ..." or "48 (device-plugin)".
    if row["xid"].isdigit():
        assert event is not None and event.kind == "xid" and event.xid == int(row["xid"])
    elif row["xid"] == "(none)":
        assert event is None or (event.kind == "gpu_lost" and event.xid is None)
    else:
        assert event is None
    assert _actual(event) == CURATED[index]


def test_kernel_log_curated_file_in_order(fixtures_dir: Path) -> None:
    text = (_kernel_logs(fixtures_dir) / "xid_lines_curated.log").read_text()
    result = parse_kernel_log(text, year_hint=HINT)

    assert result.errors == []
    expected_lines = [n for n, e in enumerate(CURATED, start=1) if e is not None]
    assert [e.line_number for e in result.events] == expected_lines
    assert [_actual(e) for e in result.events] == [e for e in CURATED if e is not None]


def test_kernel_log_events_fit_the_wire_schema(fixtures_dir: Path) -> None:
    text = (_kernel_logs(fixtures_dir) / "xid_lines_curated.log").read_text()
    for event in parse_kernel_log(text, year_hint=HINT).events:
        if event.ts is None:
            continue  # monotonic or no stamp: the collector supplies the time
        Event(
            kind=event.kind,
            ts=event.ts,
            pci_bus_id=event.pci_bus_id,
            xid=event.xid,
            message=event.message,
            pid=event.pid,
            process=event.process,
        )


def test_kernel_log_dmesg_iso_h100_incident(fixtures_dir: Path) -> None:
    path = _kernel_logs(fixtures_dir) / "gpud__dmesg-time-format-iso__xid48-63-94_H100.log"
    result = parse_kernel_log(path.read_text())

    assert result.errors == []
    assert [e.xid for e in result.events] == [48, 63] + [94] * 9
    first = result.events[0]
    assert first.line_number == 11  # ten nvidia-peermem lines come first
    assert first.ts == _utc(2024, 11, 15, 12, 2, 3, 470068)
    assert first.pid is None and first.process is None
    channels = [e.message for e in result.events if e.pid == 1248209]
    assert channels == [f"Ch {n:08x}" for n in range(8, 16)]
    assert {e.process for e in result.events if e.pid is not None} == {"python3.10"}
    assert {e.pci_bus_id for e in result.events} == {"0000:19:00.0"}


def test_kernel_log_dmesg_decode_iso_burst(fixtures_dir: Path) -> None:
    path = _kernel_logs(fixtures_dir) / "gpud__dmesg-decode-iso__xid13-43.log"
    result = parse_kernel_log(path.read_text())

    assert result.errors == []
    assert Counter(e.xid for e in result.events) == {13: 629, 43: 7}
    assert {e.pci_bus_id for e in result.events} == {"0000:38:00.0"}
    stamps = [e.ts for e in result.events]
    assert all(ts is not None and ts.date() == _utc(2025, 1, 21).date() for ts in stamps)
    numbers = [e.line_number for e in result.events]
    assert numbers == sorted(n for n in numbers if n is not None)  # all set, in file order
    assert {e.process for e in result.events if e.xid == 43} == {"pt_main_thread"}


@pytest.mark.parametrize(
    "name",
    [
        "m4-logs__dmesg_A100_node_no-xid.txt",  # a node that hung with no Xid at all
        "gpud__fabricmanager.log",
        "gpud__kmsg-raw.log",
    ],
)
def test_kernel_log_without_gpu_events(fixtures_dir: Path, name: str) -> None:
    result = parse_kernel_log((_kernel_logs(fixtures_dir) / name).read_text())

    assert result.events == []
    assert result.errors == []


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("prefix", "ts"),
    [
        ("", None),
        ("[ 1234.567890] ", None),
        ("4,1021,1234567890,-;", None),
        ("[Mon Jan  1 12:00:00 2024] ", _utc(2024, 1, 1, 12)),
        ("Jan  1 12:00:00 host kernel: ", _utc(HINT, 1, 1, 12)),
        ("Jan  1 12:00:00.250000 host kernel: [ 5.0] ", _utc(HINT, 1, 1, 12, 0, 0, 250000)),
        ("2024-01-01T12:00:00,123456+00:00 ", _utc(2024, 1, 1, 12, 0, 0, 123456)),
        ("kern  :err   : 2024-01-01T14:00:00,5+02:00 ", _utc(2024, 1, 1, 12, 0, 0, 500000)),
        ("2024-01-01T12:00:00Z host kernel: ", _utc(2024, 1, 1, 12)),
    ],
)
def test_kernel_line_prefixes(prefix: str, ts: datetime | None) -> None:
    event = parse_kernel_line(prefix + XID_79, year_hint=HINT)

    assert event == KernelEvent(
        kind="xid",
        xid=79,
        pci_bus_id="0000:3b:00.0",
        pid=1234,
        process="python",
        ts=ts,
        message="GPU has fallen off the bus.",
    )


def test_kernel_line_syslog_without_hint_uses_current_year() -> None:
    event = parse_kernel_line("Mar  3 04:05:06 h kernel: " + XID_79)

    assert event is not None and event.ts is not None
    assert event.ts.year == datetime.now(UTC).year


def test_kernel_line_reads_zoneless_stamps_in_given_zone() -> None:
    plus_two = timezone(timedelta(hours=2))
    event = parse_kernel_line("[Mon Jan  1 12:00:00 2024] " + XID_79, tz=plus_two)

    assert event is not None and event.ts == _utc(2024, 1, 1, 10)


def test_kernel_line_impossible_date_keeps_event_without_ts() -> None:
    event = parse_kernel_line("Feb 29 12:00:00 h kernel: " + XID_79, year_hint=2023)

    assert event is not None and event.xid == 79 and event.ts is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "NVRM: Xid (0000:3b:00): 13, Graphics Exception: ChID 0010",
            ("0000:3b:00.0", 13, None, None, "Graphics Exception: ChID 0010"),
        ),
        (
            "NVRM: Xid (PCI:0000:3B:00.0): 31, pid=77, name=my app, MMU Fault",
            ("0000:3b:00.0", 31, 77, "my app", "MMU Fault"),
        ),
        ("NVRM: Xid (PCI:0000:3b:00): 79", ("0000:3b:00.0", 79, None, None, "")),
        ("NVRM: Xid (PCI:0000:3b:00): 45, pid=9, Ch 01", ("0000:3b:00.0", 45, 9, None, "Ch 01")),
    ],
)
def test_kernel_line_body_variants(
    line: str, expected: tuple[str, int, int | None, str | None, str]
) -> None:
    event = parse_kernel_line(line)

    assert event is not None
    assert (event.pci_bus_id, event.xid, event.pid, event.process, event.message) == expected


@pytest.mark.parametrize(
    ("line", "pci"),
    [
        ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", "0000:3b:00.0"),
        ("[ 12.5] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", "0000:91:00.0"),
        ("NVRM: The GPU has fallen off the bus.", None),
    ],
)
def test_kernel_line_gpu_lost_without_xid(line: str, pci: str | None) -> None:
    event = parse_kernel_line(line)

    assert event is not None
    assert (event.kind, event.xid, event.pci_bus_id) == ("gpu_lost", None, pci)
    assert event.message.endswith("fallen off the bus.")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  525.60.13",
        "NVRM: GPU at PCI:0000:03:00: GPU-455d8f70-2051-db6c-0430-ffc457bff834",
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        "XidCriticalError: Xid=48 on Device=GPU-e3dbf294; marking device as unhealthy.",
        "kernel: the job says the GPU has fallen off the bus",  # no NVRM: not the driver
    ],
)
def test_kernel_line_ignores_non_events(line: str) -> None:
    assert parse_kernel_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        "[ 99.1] NVRM: Xid (PCI:0000:3b",
        "NVRM: Xid (PCI:0000:3b:00): ",
        "NVRM: Xid (PCI:0000:3b:00): pid=12, name=x, no code",
        "NVRM: Xid (PCI:12345:3b:00): 79, GPU has fallen off the bus.",  # domain > 0xffff
    ],
)
def test_kernel_line_unreadable_xid_raises(line: str) -> None:
    with pytest.raises(ParseError):
        parse_kernel_line(line)


def test_kernel_log_collects_bad_lines_and_keeps_good_ones() -> None:
    text = "\n".join(["boot", XID_79, "NVRM: Xid (PCI:0000:3b", "[ 1.0] " + XID_79])
    result = parse_kernel_log(text)

    assert [e.line_number for e in result.events] == [2, 4]
    assert [err.line_number for err in result.errors] == [3]
    assert str(result.errors[0]).startswith("line 3: cannot read the Xid code")


@pytest.mark.parametrize(
    ("line", "seconds"),
    [
        ("[ 1234.567890] " + XID_79, 1234.56789),
        ("Jan  1 12:00:00 h kernel: [6540565.266214] " + XID_79, 6540565.266214),
        ("6,3964,206764307,-;" + XID_79, 206.764307),
        (XID_79, None),
        ("[Mon Jan  1 12:00:00 2024] " + XID_79, None),
    ],
)
def test_monotonic_seconds(line: str, seconds: float | None) -> None:
    assert monotonic_seconds(line) == (pytest.approx(seconds) if seconds is not None else None)


def test_kernel_line_with_a_nul_in_the_process_name_keeps_the_event(fixtures_dir: Path) -> None:
    """A real fixture line with a NUL injected in its process name: the event is kept, the NUL
    (and any other control character) becomes U+FFFD, and the event fits the wire schema."""
    log = (_kernel_logs(fixtures_dir) / "xid_lines_curated.log").read_text().splitlines()
    (line,) = [line for line in log if "name=pt_main_thread, Ch 00000008, intr" in line]
    poisoned = line.replace("name=pt_main_thread", "name=pt_main\x00thr\x07ead")
    event = parse_kernel_line(poisoned)
    assert event is not None
    assert (event.xid, event.pid, event.process) == (31, 626486, "pt_main\ufffdthr\ufffdead")
    assert event.message.startswith("Ch 00000008, intr 00000000. MMU Fault")
    wire = Event(kind=event.kind, ts=_utc(2024, 8, 31), xid=event.xid, process=event.process)
    assert "\x00" not in wire.model_dump_json()


def test_kernel_line_xid79_with_a_nul_in_the_message_keeps_the_event() -> None:
    event = parse_kernel_line(
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid=1234, name=pyth\x00on, "
        "GPU has fallen off\x00 the bus."
    )
    assert event is not None and event.xid == 79
    assert event.process == "pyth\ufffdon" and event.message == "GPU has fallen off\ufffd the bus."
