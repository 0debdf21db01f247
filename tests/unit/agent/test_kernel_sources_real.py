"""The kernel-log parsers beyond Xid on real captures, checked two ways.

Expected values for specific lines were read by hand from each file (the line numbers, devices,
severities and error names below). Totals are checked against a second, independent reading of
the same text written differently from the parsers: plain substring counts and a short regex for
the EDAC counts, the AER error bits recomputed from ``status & ~mask``, and the machine-check
severity recomputed from the status register's UC/PCC bits.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_events import KernelLogReader, parse_kernel_events
from fleetwatch.agent.parsers.kernel_log import parse_kernel_log
from fleetwatch.telemetry import Event

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log_captures"


def _read(path: Path) -> tuple[list[KernelEvent], list[int]]:
    result = parse_kernel_events(path.read_text(errors="replace"), year_hint=2025)
    return result.events, [e.line_number or 0 for e in result.errors]


def _by_line(events: list[KernelEvent]) -> dict[int, KernelEvent]:
    return {e.line_number or 0: e for e in events}


def _d(event: KernelEvent) -> dict[str, object]:
    assert event.details is not None
    return event.details


# -- NVSwitch ---------------------------------------------------------------------------------


def test_sxid_multi_switch_records_from_gpud(fixtures_dir: Path) -> None:
    path = (
        fixtures_dir / "nvswitch_fabric" / "gpud__dmesg_Xid79-with-SXid20034-LTSSM-multi-switch.log"
    )
    events, errors = _read(path)

    assert errors == []
    assert [(e.line_number, e.kind) for e in events] == [
        (3, "xid"),
        (4, "gpu_lost"),
        (6, "sxid"),
        (7, "sxid"),
        (8, "sxid"),
        (10, "sxid"),
        (11, "sxid"),
    ]
    sxid = _by_line(events)
    # head line, its switch, its link; the Severity/Data lines that follow join their switch's
    # record, wherever another switch's line falls between them.
    assert (sxid[6].pci_bus_id, _d(sxid[6])["link"], _d(sxid[6])["switch"]) == (
        "0000:06:00.0",
        48,
        "nvidia-nvswitch1",
    )
    assert (sxid[7].pci_bus_id, _d(sxid[7])["link"], len(_d(sxid[7])["data"])) == (  # type: ignore[arg-type]
        "0000:05:00.0",
        63,
        9,
    )
    assert (_d(sxid[10])["link"], _d(sxid[10])["engine_instance"]) == (37, 37)
    assert (_d(sxid[11])["link"], _d(sxid[11])["engine_instance"]) == (62, 62)
    # Line 8 is a Severity line whose head is not in the capture: a partial record, fatal by its
    # own "Severity 1" (NVSWITCH_ERROR_SEVERITY_FATAL).
    assert _d(sxid[8])["partial"] is True
    assert (_d(sxid[8])["severity"], _d(sxid[8])["severity_from"]) == ("fatal", "severity_field")
    assert {_d(e)["sxid"] for e in events if e.kind == "sxid"} == {20034}
    assert {_d(e)["severity"] for e in events if e.kind == "sxid"} == {"fatal"}

    # Independent reading: head lines are the SXid lines whose text after the code starts with
    # a severity word.
    heads = [
        line
        for line in path.read_text().splitlines()
        if "SXid" in line
        and line.split("): ", 1)[1].split(", ", 1)[1].split(",")[0]
        in ("Fatal", "Non-fatal", "Correctable")
    ]
    whole = [e for e in events if e.kind == "sxid" and not _d(e).get("partial")]
    assert len(heads) == len(whole) == 4


def test_sxid_fabric_manager_errors_with_port(fixtures_dir: Path) -> None:
    path = (
        fixtures_dir
        / "nvswitch_fabric"
        / "gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
    )
    events, errors = _read(path)

    assert errors == []
    fatal, non_fatal = events  # the two multicast lines are no SXid
    assert (fatal.line_number, fatal.pci_bus_id, fatal.ts) == (
        1,
        "0000:86:00.0",
        datetime(2024, 7, 23, 7, 53, 55, tzinfo=UTC),
    )
    assert {k: _d(fatal)[k] for k in ("sxid", "severity", "link", "physical_id")} == {
        "sxid": 20034,
        "severity": "fatal",
        "link": 33,
        "physical_id": 3,
    }
    assert (_d(non_fatal)["sxid"], _d(non_fatal)["severity"], _d(non_fatal)["link"]) == (
        12028,
        "non_fatal",
        61,
    )
    assert _d(non_fatal)["catalog_name"] == "egress nonposted PRIV error"


def test_sxid_inside_the_full_fabric_manager_log(fixtures_dir: Path) -> None:
    events, errors = _read(fixtures_dir / "kernel_logs" / "gpud__fabricmanager.log")

    assert errors == []
    (event,) = events  # 100 INFO lines, one ERROR at the end
    assert (event.line_number, event.kind, _d(event)["sxid"], _d(event)["link"]) == (
        100,
        "sxid",
        12028,
        61,
    )


def test_reader_keeps_every_xid_of_the_xid_parser(fixtures_dir: Path) -> None:
    """The new reader gives exactly the Xid and lost-GPU events ``parse xid`` gives, plus the
    NVSwitch lines of the curated file."""
    for name in ("xid_lines_curated.log", "gpud__dmesg-decode-iso__xid13-43.log"):
        text = (fixtures_dir / "kernel_logs" / name).read_text()
        old = parse_kernel_log(text, year_hint=2021).events
        new = parse_kernel_events(text, year_hint=2021).events
        assert [e for e in new if e.kind in ("xid", "gpu_lost")] == old
    curated = (fixtures_dir / "kernel_logs" / "xid_lines_curated.log").read_text()
    sxids = [e for e in parse_kernel_events(curated).events if e.kind == "sxid"]
    assert [(e.line_number, e.pci_bus_id) for e in sxids] == [
        (15, "0000:06:00.0"),
        (16, "0000:05:00.0"),  # a Data line alone: partial, fatal by NVIDIA's catalog
    ]
    assert _d(sxids[1])["severity_from"] == "catalog"


# -- PCIe AER -----------------------------------------------------------------------------------


def _aer_bits(status: str, mask: str) -> list[int]:
    unmasked = int(status, 16) & ~int(mask, 16)
    return [bit for bit in range(32) if unmasked >> bit & 1]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "lkml-2022-03-14_aer-corrected-rxerr_dpc-fatal-sdes_icelake.log",
            [
                (2, "corrected", "Physical Layer", ["RxErr"]),
                (9, "fatal", "Transaction Layer", ["SDES"]),
            ],
        ),
        (
            "lkml-2024-01-11_aer-corrected-nonfatalerr_fatal-tlp-malftlp.log",
            [
                (2, "corrected", "Transaction Layer", ["NonFatalErr"]),
                (6, "fatal", "Transaction Layer", ["TLP", "MalfTLP"]),
            ],
        ),
    ],
)
def test_aer_records_from_real_ports(
    name: str, expected: list[tuple[int, str, str, list[str]]]
) -> None:
    path = CAPTURES / name
    events, errors = _read(path)

    assert errors == []
    got = [
        (e.line_number, _d(e)["severity"], _d(e)["layer"], _d(e)["errors"])
        for e in events
        if e.kind == "pcie_aer"
    ]
    assert got == expected
    assert {e.kind for e in events} == {"pcie_aer"}
    # Independent readings: one record per "PCIe Bus Error" line; the error names are the bits
    # of status & ~mask.
    assert path.read_text().count("PCIe Bus Error: severity=") == len(events)
    for event in events:
        details = _d(event)
        assert details["error_bits"] == _aer_bits(str(details["status"]), str(details["mask"]))


def test_aer_announcement_and_first_error() -> None:
    events, _ = _read(CAPTURES / "lkml-2022-03-14_aer-corrected-rxerr_dpc-fatal-sdes_icelake.log")
    corrected, fatal = events

    assert corrected.pci_bus_id == fatal.pci_bus_id == "0000:89:02.0"
    assert _d(corrected)["reported_by"] == _d(corrected)["source"] == "0000:89:02.0"
    assert _d(corrected)["multiple"] is False
    assert "reported_by" not in _d(fatal)  # reached through DPC: no announcement before it
    assert (_d(fatal)["first_error"], _d(fatal)["vendor_device"]) == ("SDES", "8086:347a")


def test_aer_head_cut_by_mail_wrapping_is_named_not_guessed() -> None:
    """A real NVIDIA GPU's AER record whose head line was cut after ``PCIe Bus Error:``."""
    events, errors = _read(
        CAPTURES / "linux-usb-2023-07-16_aer-corrected-badtlp-on-nvidia-gpu_mail-wrapped.log"
    )

    assert events == []
    assert errors == [3]


# -- machine checks and EDAC ------------------------------------------------------------------


def _status_severity(status: str) -> str:
    value = int(status, 16)
    if not value >> 61 & 1:
        return "corrected"
    return "fatal" if value >> 57 & 1 else "uncorrected"


def test_amd_zen4_decoded_dram_ecc_and_edac_banner(fixtures_dir: Path) -> None:
    name = (
        "web__dmesg_AMD-Zen4-Ryzen_amd64_edac-banner_plus_MCE-DRAM-ECC-CE_cannot-decode-address.log"
    )
    events, errors = _read(fixtures_dir / "host_hw_errors" / name)

    assert errors == []
    mce, edac = events  # the nine banner lines give nothing
    assert (mce.line_number, mce.kind, edac.line_number, edac.kind) == (12, "mce", 17, "edac")
    assert {k: _d(mce)[k] for k in ("source", "severity", "cpu", "bank", "status")} == {
        "source": "mce_amd",
        "severity": "corrected",
        "cpu": 0,
        "bank": 21,
        "status": "0xdc2040000400011b",
    }
    assert _d(mce)["events_logged"] is True  # "Machine check events logged" on line 11
    assert _d(mce)["error"] == "DRAM ECC error."
    assert _status_severity(str(_d(mce)["status"])) == _d(mce)["severity"]
    assert {k: _d(edac)[k] for k in ("severity", "count", "memory_controller", "label")} == {
        "severity": "corrected",
        "count": 1,
        "memory_controller": 0,
        "label": "mc#0csrow#3channel#0",
    }
    assert _d(edac)["location"] == {
        "csrow": 3,
        "channel": 0,
        "page": "0x0",
        "offset": "0x0",
        "grain": 64,
        "syndrome": "0x1",
    }


def test_inspur_ghes_and_sbridge_decode_with_overflowed_count(fixtures_dir: Path) -> None:
    name = (
        "web__syslog-rfc3339_GHES-corrected_EDAC-sbridge-CE-OVERFLOW_soft-offline_"
        "Inspur-NF5270M3.log"
    )
    events, errors = _read(fixtures_dir / "host_hw_errors" / name)

    assert errors == []
    ghes, sbridge, edac = events
    assert (ghes.line_number, _d(ghes)["source"], _d(ghes)["severity"]) == (2, "ghes", "corrected")
    assert _d(ghes)["section_type"] == "memory error"
    assert ghes.ts == datetime(2025, 4, 4, 10, 23, 55, 230128, tzinfo=UTC)  # 18:23:55 at +08:00
    assert (sbridge.line_number, _d(sbridge)["source"], _d(sbridge)["bank"]) == (
        11,
        "edac_sbridge",
        7,
    )
    assert _d(sbridge)["status"] == "0xcc00050000010092"
    assert _d(sbridge)["severity"] == _status_severity("cc00050000010092") == "corrected"
    assert (_d(sbridge)["socket"], _d(sbridge)["time"]) == (0, 1743762241)
    assert (edac.line_number, _d(edac)["count"], _d(edac)["overflow"]) == (17, 20, True)
    assert _d(edac)["label"] == "CPU_SrcID#0_Ha#0_Chan#2_DIMM#0"


def test_icelake_injection_ghes_skx_decode_and_ue_counts() -> None:
    events, errors = _read(
        CAPTURES / "lkml-2021-08-12_einj-ghes-recoverable_edac-skx-ue_icelake.log"
    )

    assert errors == []
    assert [(e.line_number, e.kind, _d(e).get("source")) for e in events] == [
        (6, "mce", "ghes"),
        (18, "mce", "edac_skx"),
        (24, "edac", None),
        (28, "mce", "edac_skx"),
        (34, "edac", None),
    ]
    ghes = events[0]
    assert (_d(ghes)["severity"], _d(ghes)["severity_text"]) == ("uncorrected", "recoverable")
    assert _d(ghes)["dimm_location"] == "NODE 3 CPU0_DIMM_G1"
    for decoded, status, bank in (
        (events[1], "0xac00000200a00090", 25),
        (events[3], "0xb40000000000009f", 255),
    ):
        assert (_d(decoded)["status"], _d(decoded)["bank"]) == (status, bank)
        assert _d(decoded)["severity"] == _status_severity(status) == "uncorrected"
        # no wall-clock prefix: the record's own TIME 1628780833 dates it
        assert decoded.ts == datetime(2021, 8, 12, 15, 7, 13, tzinfo=UTC)
    assert [
        (_d(e)["severity"], _d(e)["count"], _d(e)["memory_controller"])
        for e in events
        if e.kind == "edac"
    ] == [
        ("uncorrected", 1, 3),
        ("uncorrected", 1, 3),
    ]


def test_console_edac_counts_add_up_including_a_cut_line() -> None:
    path = CAPTURES / "lkml-2023-08-28_edac-ue-ce-console-with-interleaved-firmware-output.log"
    events, errors = _read(path)

    assert errors == []
    assert [e.line_number for e in events] == [2, 3, 4, 5, 6, 7, 8]
    totals: Counter[str] = Counter()
    for event in events:
        totals[str(_d(event)["severity"])] += int(_d(event)["count"])  # type: ignore[call-overload]
    # Independent reading: count and CE/UE after "EDAC MCn:", however the line ends.
    expected: Counter[str] = Counter()
    for count, kind in re.findall(r"EDAC MC\d+: (\d+) ([CU]E)\b", path.read_text()):
        expected["corrected" if kind == "CE" else "uncorrected"] += int(count)
    assert totals == expected == Counter({"corrected": 9, "uncorrected": 1})
    cut = events[-1]
    assert (_d(cut)["count"], _d(cut)["incomplete"]) == (3, True)
    assert "label" not in _d(cut)
    assert events[0].ts == datetime(2023, 6, 22, 21, 55, 31, 352446, tzinfo=UTC)


def test_mce_exception_with_context_corrupt_is_fatal() -> None:
    events, errors = _read(CAPTURES / "lkml-2025-11-07_mce-exception-pcc-panic_indented.log")

    assert errors == []
    (event,) = events
    assert (event.line_number, event.kind) == (2, "mce")
    assert {k: _d(event)[k] for k in ("cpu", "bank", "mcg_status", "exception", "severity")} == {
        "cpu": 0,
        "bank": 0,
        "mcg_status": "0x4",
        "exception": True,
        "severity": "fatal",
    }
    assert _d(event)["panic"] == "Processor context corrupt"
    assert _status_severity("b2000000c0060001") == "fatal"  # UC and PCC set: agrees
    assert _d(event)["severity_from"] == "panic"  # the driver's own verdict is preferred


def test_mce_head_cut_by_mail_wrapping_is_named_and_the_notice_kept() -> None:
    events, errors = _read(CAPTURES / "amdgfx-2020-03-08_mce-amd-bank5-mail-wrapped.log")

    assert errors == [3]  # "CPU 2: Machine Check: 0 Bank 5:" with the status on the next line
    (notice,) = events
    assert (notice.line_number, notice.kind, _d(notice)) == (
        2,
        "mce",
        {"source": "mce", "events_logged": True},
    )


@pytest.mark.parametrize(
    "path",
    [
        CAPTURES / "gpud_pstore-dmesg_amd-genoa_edac-banner_test-panic.txt",
        Path("kernel_logs/m4-logs__dmesg_A100_node_no-xid.txt"),
        Path("kernel_logs/gpud__kmsg-raw.log"),
    ],
    ids=["gpud-genoa-edac-banner", "m4-a100-hang", "gpud-kmsg"],
)
def test_logs_without_hardware_errors_give_no_event(fixtures_dir: Path, path: Path) -> None:
    full = path if path.is_absolute() else fixtures_dir / path
    events, errors = _read(full)

    assert events == [] and errors == []


# -- every capture, whole and line by line ---------------------------------------------------


def _all_captures(fixtures_dir: Path) -> list[Path]:
    shared = [
        fixtures_dir / folder / name
        for folder in ("nvswitch_fabric", "host_hw_errors", "kernel_logs")
        for name in sorted(p.name for p in (fixtures_dir / folder).iterdir())
        if not name.endswith(".tsv")
    ]
    return shared + sorted(CAPTURES.glob("*.log")) + sorted(CAPTURES.glob("*.txt"))


def test_every_event_of_every_capture_fits_the_wire_schema(fixtures_dir: Path) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for path in _all_captures(fixtures_dir):
        for event in _read(path)[0]:
            Event(
                kind=event.kind,
                ts=event.ts or now,
                pci_bus_id=event.pci_bus_id,
                xid=event.xid,
                message=event.message[:4096],
                pid=event.pid,
                process=event.process,
                details=event.details,
            )


def test_reading_in_polls_neither_loses_nor_repeats_an_event(fixtures_dir: Path) -> None:
    """The agent reads what each poll finds and closes open records at the first empty poll. A
    record cut by an empty poll between its lines still gives one event (its late lines are
    absorbed), so every capture gives the same events read in polls of 1 to 7 lines, with an
    empty poll after every third one, as read whole."""
    for path in _all_captures(fixtures_dir):
        whole = _read(path)[0]
        lines = path.read_text(errors="replace").splitlines()
        reader = KernelLogReader(year_hint=2025)
        polled: list[KernelEvent] = []
        start = poll = 0
        while start < len(lines):
            size = 1 + (poll * 5) % 7
            for line in lines[start : start + size]:
                polled += reader.feed(line)[0]
            start, poll = start + size, poll + 1
            if poll % 3 == 0:
                polled += reader.flush(final=False)  # an empty poll
        polled += reader.flush()
        assert [(e.line_number, e.kind, e.pci_bus_id) for e in whole] == sorted(
            [(e.line_number, e.kind, e.pci_bus_id) for e in polled], key=lambda k: k[0] or 0
        ), path.name
