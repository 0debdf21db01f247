"""Line formats of the kernel-log sources that the real captures do not cover, and bad lines.

The lines here are written for the test after the kernel's and drivers' format strings (cited
in each parser module), with expected values read off the line by hand.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_events import KernelLogReader, parse_kernel_events
from fleetwatch.agent.parsers.pci_address import pci_address, requester_id_address

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log_captures"


def _events(*lines: str) -> list[KernelEvent]:
    result = parse_kernel_events("\n".join(lines), year_hint=2025)
    assert result.errors == [], [str(e) for e in result.errors]
    return result.events


def _d(event: KernelEvent) -> dict[str, object]:
    assert event.details is not None
    return event.details


# -- PCI addresses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0005:01:00.0", "0005:01:00.0"),
    ],
)
def test_pci_address_forms_are_one(text: str, canonical: str) -> None:
    assert pci_address(text) == canonical


@pytest.mark.parametrize(
    ("requester", "port", "address"),
    [
        ("00e5", "0000:00:1c.5", "0000:00:1c.5"),
        ("0010", "0000:00:02.0", "0000:00:02.0"),
        ("0300", "0002:00:01.0", "0002:03:00.0"),
    ],
)
def test_requester_id_is_bus_device_function(requester: str, port: str, address: str) -> None:
    assert requester_id_address(requester, domain_of=port) == address


# -- PCIe AER -----------------------------------------------------------------------------------


def test_aer_old_format_with_requester_ids_and_long_error_names() -> None:
    (event,) = _events(
        "Jan 29 20:50:17 host kernel: pcieport 0000:00:1c.5: AER: Corrected error received: "
        "id=00e5",
        "Jan 29 20:50:17 host kernel: pcieport 0000:00:1c.5: PCIe Bus Error: severity=Corrected, "
        "type=Physical Layer, id=00e5(Receiver ID)",
        "Jan 29 20:50:17 host kernel: pcieport 0000:00:1c.5:   device [8086:9d15] error "
        "status/mask=00000001/00002000",
        "Jan 29 20:50:17 host kernel: pcieport 0000:00:1c.5:    [ 0] Receiver Error         "
        "(First)",
    )
    assert (event.kind, event.pci_bus_id, event.line_number) == ("pcie_aer", "0000:00:1c.5", 2)
    assert event.ts == datetime(2025, 1, 29, 20, 50, 17, tzinfo=UTC)
    assert {k: _d(event)[k] for k in ("severity", "source", "errors", "first_error", "agent")} == {
        "severity": "corrected",
        "source": "0000:00:1c.5",
        "errors": ["Receiver Error"],
        "first_error": "Receiver Error",
        "agent": "Receiver ID",
    }


def test_aer_new_wording_names_the_gpu_that_reported_it() -> None:
    port, gpu = _events(
        "[68185.875052] pcieport 0000:00:03.1: AER: Multiple Correctable error message received "
        "from 0000:07:00.0",
        "[68185.875237] pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, "
        "type=Data Link Layer, (Transmitter ID)",
        "[68185.875244] pcieport 0000:00:03.1:   device [1022:1453] error "
        "status/mask=000011c0/00006000",
        "[68185.875252] pcieport 0000:00:03.1:    [ 6] BadTLP                ",
        "[68185.875295] nvidia 0000:07:00.0: PCIe Bus Error: severity=Correctable, "
        "type=Data Link Layer, (Transmitter ID)",
        "[68185.875259] pcieport 0000:00:03.1:    [ 7] BadDLLP               ",
        "[68185.875301] nvidia 0000:07:00.0:   device [10de:2184] error "
        "status/mask=00001000/0000a000",
        "[68185.875308] nvidia 0000:07:00.0:    [12] Timeout               ",
    )
    # interleaved lines go to their own device's record
    assert (port.pci_bus_id, _d(port)["errors"], _d(port)["multiple"]) == (
        "0000:00:03.1",
        ["BadTLP", "BadDLLP"],
        True,
    )
    assert _d(port)["reported_by"] == "0000:00:03.1" and _d(port)["source"] == "0000:07:00.0"
    assert (gpu.pci_bus_id, _d(gpu)["driver"], _d(gpu)["vendor_device"]) == (
        "0000:07:00.0",
        "nvidia",
        "10de:2184",
    )
    assert (_d(gpu)["severity"], _d(gpu)["errors"]) == ("corrected", ["Timeout"])
    assert "reported_by" not in _d(gpu)  # the announcement went with the first record


@pytest.mark.parametrize(
    ("wording", "severity"),
    [
        ("Uncorrected (Non-Fatal)", "non_fatal"),
        ("Uncorrectable (Non-Fatal)", "non_fatal"),
        ("Uncorrected (Fatal)", "fatal"),
        ("Uncorrectable (Fatal)", "fatal"),
        ("Corrected", "corrected"),
        ("Correctable", "corrected"),
    ],
)
def test_aer_severity_wordings(wording: str, severity: str) -> None:
    (event,) = _events(
        f"igb 0000:09:00.0: PCIe Bus Error: severity={wording}, type=Transaction Layer, "
        "(Requester ID)",
        "igb 0000:09:00.0:   device [8086:1537] error status/mask=00004000/00000000",
        "igb 0000:09:00.0:    [14] CmpltTO",
        "igb 0000:09:00.0: AER:   TLP Header: 00000000 00000000 00000000 00000000",
    )
    assert _d(event)["severity"] == severity
    assert _d(event)["tlp_header"] == "00000000 00000000 00000000 00000000"


def test_aer_announcement_without_a_record_is_an_event_of_its_own() -> None:
    (event,) = _events(
        "pcieport 0000:00:01.1: AER: Uncorrected (Fatal) error received: 0000:01:00.0",
        "pcieport 0000:00:01.1: AER: can't find device of ID0100",
    )
    assert (event.kind, event.pci_bus_id) == ("pcie_aer", "0000:01:00.0")
    assert (_d(event)["severity"], _d(event)["announcement_only"]) == ("fatal", True)


def test_aer_through_firmware_ghes_names_the_device() -> None:
    (event,) = _events(
        "{2}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 5",
        "{2}[Hardware Error]: event severity: fatal",
        "{2}[Hardware Error]:  Error 0, type: fatal",
        "{2}[Hardware Error]:   section_type: PCIe error",
        "{2}[Hardware Error]:   port_type: 4, root port",
        "{2}[Hardware Error]:   device_id: 0000:00:03.0",
    )
    assert (event.kind, event.pci_bus_id, _d(event)["severity"]) == (
        "pcie_aer",
        "0000:00:03.0",
        "fatal",
    )
    assert _d(event)["source"] == "ghes"


# -- NVSwitch -----------------------------------------------------------------------------------


def test_sxid_non_fatal_first_and_kmsg_record() -> None:
    (event,) = _events(
        "4,5432,131453740743,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, "
        "Link 32 egress non-posted PRIV error (First)"
    )
    assert (event.pci_bus_id, event.ts) == ("0000:05:00.0", None)
    assert {k: _d(event)[k] for k in ("sxid", "severity", "link", "first", "error")} == {
        "sxid": 12028,
        "severity": "non_fatal",
        "link": 32,
        "first": True,
        "error": "egress non-posted PRIV error",
    }


def test_sxid_without_a_link_and_an_unknown_code() -> None:
    interrupt, unknown = _events(
        "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 10003, Fatal, unhandled interrupt in "
        "_nvswitch_service_nvldl(1240)",
        "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 29999, something new",
    )
    assert (_d(interrupt)["severity"], _d(interrupt)["catalog_class"]) == ("fatal", "always_fatal")
    assert "link" not in _d(interrupt)
    # not in NVIDIA's catalog and the line does not say: severity unknown, so not critical
    assert "severity" not in _d(unknown) and "catalog_class" not in _d(unknown)


def test_sxid_severity_comes_from_the_catalog_when_no_line_says() -> None:
    (event,) = _events(
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 22013, Data {0x00000001, 0x00000000}"
    )
    assert (_d(event)["severity"], _d(event)["severity_from"]) == ("non_fatal", "catalog")
    assert _d(event)["catalog_name"] == "Minion Link DLREQ interrupt"


# -- machine checks and EDAC ------------------------------------------------------------------


def test_amd_decoder_severity_words() -> None:
    deferred, fatal = _events(
        "[Hardware Error]: Deferred error, no action required.",
        "[Hardware Error]: CPU:3 (19:1:1) "
        "MC17_STATUS[-|-|MiscV|AddrV|-|-|SyndV|UECC|Deferred|-|-]: 0x9c2040000000011b",
        "[Hardware Error]: System Fatal error.",
        "[Hardware Error]: CPU:4 (19:21:2) MC5_STATUS[-|UE|MiscV|AddrV|PCC|TCC|SyndV|-|-|-]: "
        "0xbea0000001000108",
    )
    assert (_d(deferred)["severity"], _d(deferred)["bank"], _d(deferred)["cpu"]) == (
        "deferred",
        17,
        3,
    )
    assert "Deferred" in _d(deferred)["flags"]  # type: ignore[operator]
    assert (_d(fatal)["severity"], _d(fatal)["status"]) == ("fatal", "0xbea0000001000108")


def test_edac_old_format_without_a_count_is_one_error() -> None:
    (event,) = _events(
        "EDAC MC0: CE page 0x1f4, offset 0x2c0, grain 8, syndrome 0x44, row 1, channel 0, label "
        '"DIMM_A2": i5000 MC0: ...'
    )
    assert (_d(event)["severity"], _d(event)["count"], _d(event)["label"]) == (
        "corrected",
        1,
        "DIMM_A2",
    )


def test_edac_banners_and_zero_counts_are_no_events() -> None:
    assert (
        _events(
            "EDAC MC0: Giving out device to module skx_edac controller Skylake Socket#0 IMC#0",
            "EDAC MC1: 0 CE memory read error on CPU_SrcID#1_MC#0_Chan#0_DIMM#0 (channel:0)",
            "EDAC sbridge: Seeking for: PCI ID 8086:0ea0",
            "EDAC amd64: MC: 2: 16384MB 3: 16384MB",
        )
        == []
    )


# -- lost GPUs ----------------------------------------------------------------------------------


def test_lost_gpu_over_three_lines_gets_the_address_of_the_first() -> None:
    events = _events(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
    )
    assert [(e.kind, e.pci_bus_id, e.line_number) for e in events] == [
        ("gpu_lost", "0000:b3:00.0", 3)
    ]


def test_lost_gpu_as_one_kmsg_record() -> None:
    (event,) = _events(
        "3,9012,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        "commands."
    )
    assert (event.kind, event.pci_bus_id) == ("gpu_lost", "0000:b3:00.0")


# -- bad lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:0", "SXid code and PCI id"),
        ("nvidia-nvswitch0: SXid (PCI:0000:00:00.0): xyz, Fatal error", "SXid code and PCI id"),
        (
            "pcieport 0000:00:01.0: PCIe Bus Error: severity=Sort of bad, type=Physical Layer",
            "severity",
        ),
        ("pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected", "severity and type"),
        ("mce: [Hardware Error]: CPU 7: Machine Check: 0 Bank", "bank and status"),
        ("[Jul 23 2024 07:53:55] [ERROR] detected NVSwitch fatal error 20034 on fid 0", "port"),
    ],
)
def test_unreadable_lines_are_named_and_reading_goes_on(line: str, reason: str) -> None:
    good = "EDAC MC0: 1 CE memory read error on DIMM_A1 (channel:0 slot:0)"
    result = parse_kernel_events("\n".join([good, line, good]))

    assert [e.line_number for e in result.events] == [1, 3]
    (error,) = result.errors
    assert error.line_number == 2
    assert str(error).startswith("line 2: ") and reason in str(error)


def test_cut_lines_of_every_capture_never_crash() -> None:
    """Every line of the captures cut at random places: events or named errors, nothing else."""
    rng = random.Random(13)  # fixed: the cuts are the same on every run
    lines = [
        line
        for path in sorted(CAPTURES.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]
    reader = KernelLogReader()
    for line in lines:
        for _ in range(4):
            cut = line[: rng.randrange(len(line) + 1)]
            events, errors = reader.feed(cut)
            assert all(isinstance(e, KernelEvent) for e in events)
            assert all(e.line_number == reader.lines_read for e in errors)
    reader.flush()
