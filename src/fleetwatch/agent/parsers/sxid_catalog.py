"""Which NVSwitch SXid codes are fatal: NVIDIA's own classification.

Source: NVIDIA Fabric Manager User Guide, appendix D "Error Handling" (D.4 Non-Fatal NVSwitch
SXid Errors, D.5 Fatal NVSwitch SXid Errors, D.6 Always Fatal NVSwitch SXid Errors, D.7 Other
Notable NVSwitch SXid Errors), https://docs.nvidia.com/datacenter/tesla/pdf/fabric-manager-user-guide.pdf,
as transcribed in leptonai/gpud ``components/accelerator/nvidia/query/sxid/sxid.go`` (commit
088be0e18a7d4a2cd9cf7daea2989ebe2074cd1d, Apache-2.0); codes and names only.

The kernel line usually says itself whether this occurrence was fatal (``Fatal, Link 48 ...`` /
``Non-fatal, ...`` / ``Correctable, ...``, printed by the driver's ``NVSWITCH_REPORT_*`` macros in
NVIDIA/open-gpu-kernel-modules ``src/common/nvswitch/kernel/inc/intr_nvswitch.h``) and that wins:
D.5 codes are fatal only when the error was not contained. The catalog answers only for lines
that do not say (``Severity``/``Data`` lines of a record whose head was lost, and other formats).
22012 appears in both D.4 and D.5; it is kept as fatal, the safer reading.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SXID_CATALOG", "SxidClass"]

SxidClass = Literal["non_fatal", "fatal", "always_fatal"]

_NON_FATAL = {  # D.4, and the not-fatal entries of D.7
    11004: "Ingress invalid ACL",
    11012: "Single bit ECC errors",
    11021: "Single bit ECC errors",
    11022: "Single bit ECC errors",
    11023: "Single bit ECC errors",
    12021: "Single bit ECC errors",
    12023: "Single bit ECC errors",
    15008: "Single bit ECC errors",
    15011: "Single bit ECC errors",
    19049: "Single bit ECC errors",
    19055: "Single bit ECC errors",
    19057: "Single bit ECC errors",
    19059: "Single bit ECC errors",
    19062: "Single bit ECC errors",
    19065: "Single bit ECC errors",
    19068: "Single bit ECC errors",
    19071: "Single bit ECC errors",
    24001: "Single bit ECC errors",
    24002: "Single bit ECC errors",
    24003: "Single bit ECC errors",
    20001: "TX Replay Error",
    12028: "egress nonposted PRIV error",
    19084: "AN1 Heartbeat Timeout Error",
    22013: "Minion Link DLREQ interrupt",
    10001: "Host_priv_error",
    10002: "Host_priv_timeout",
    10004: "Host_thermal_event_start",
    10005: "Host_thermal_event_end",
}
_FATAL = {  # D.5
    11001: "ingress invalid command",
    11009: "ingress invalid VCSet",
    11013: "ingress header DBE",
    11018: "ingress RID DBE",
    11019: "ingress RLAN DBE",
    11020: "ingress control parity",
    12001: "egress crossbar overflow",
    12002: "egress packet route",
    12022: "egress input ECC DBE error",
    12024: "egress output ECC DBE error",
    12025: "egress credit overflow",
    12026: "egress destination request ID error",
    12027: "egress destination response ID error",
    12030: "egress control parity error",
    12031: "egress credit parity error",
    12032: "egress flit type mismatch",
    14017: "TS ATO timeout",
    15001: "route buffer over/underflow",
    15006: "route transdone over/underflow",
    15009: "route GLT DBE",
    15010: "route parity",
    15012: "route incoming DBE",
    15013: "route credit parity",
    19047: "NCISOC HDR ECC DBE Error",
    19048: "NCISOC DAT ECC DBE Error",
    19054: "HDR RAM ECC DBE Error",
    19056: "DAT0 RAM ECC DBE Error",
    19058: "DAT1 RAM ECC DBE Error",
    19060: "CREQ RAM HDR ECC DBE Error",
    19061: "CREQ RAM DAT ECC DBE Error",
    19063: "Response RAM HDR ECC DBE Error",
    19064: "Response RAM DAT ECC DBE Error",
    19066: "COM RAM HDR ECC DBE Error",
    19067: "COM RAM DAT ECC DBE Error",
    19069: "RSP1 RAM HDR ECC DBE Error",
    19070: "RSP1 RAM DAT ECC DBE Error",
    20034: "LTSSM Fault Up",
    22012: "Minion Link NA interrupt",
    24004: "sourcetrack TCEN0 crubmstore DBE",
    24005: "sourcetrack TCEN0 TD crubmstore DBE",
    24006: "sourcetrack TCEN1 crubmstore DBE",
    24007: "sourcetrack timeout error",
}
_ALWAYS_FATAL = {  # D.6, and 10003 from D.7
    12020: "egress sequence ID error",
    22003: "Minion Halt",
    22011: "Minion exterror",
    23001: "ingress SRC-VC buffer overflow",
    23002: "ingress SRC-VC buffer underflow",
    23003: "egress DST-VC credit overflow",
    23004: "egress DST-VC credit underflow",
    23005: "ingress packet burst error",
    23006: "ingress packet sticky error",
    23007: "possible bubbles at ingress",
    23008: "ingress packet invalid dst error",
    23009: "ingress packet parity error",
    23010: "ingress SRC-VC buffer overflow",
    23011: "ingress SRC-VC buffer underflow",
    23012: "egress DST-VC credit overflow",
    23013: "egress DST-VC credit underflow",
    23014: "ingress packet burst error",
    23015: "ingress packet sticky error",
    23016: "possible bubbles at ingress",
    23017: "ingress credit parity error",
    10003: "Host_unhandled_interrupt",
}

SXID_CATALOG: dict[int, tuple[str, SxidClass]] = {
    **{code: (name, "non_fatal") for code, name in _NON_FATAL.items()},
    **{code: (name, "fatal") for code, name in _FATAL.items()},
    **{code: (name, "always_fatal") for code, name in _ALWAYS_FATAL.items()},
}
