"""``dcgmi diag -r <level> -j``: run it, and read its JSON into one check per test and GPU.

Two document shapes exist (the names are DCGM's own, ``nvvs/include/NvvsJsonStrings.h``)::

    DCGM 2.x/3.x  {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment",
                     "tests": [{"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "PASS",
                     "warnings": [...]}]}, null, ...]}], "version": "3.1.0"}}
    DCGM 4.x      {"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group": "GPU",
                     "entity_id": 0, "status": "Pass", "warnings": [{"warning": "..."}]}] ...]},
                   "entity_groups": [...], "metadata": {"version": "4.2.3",
                     "Driver Version Detected": "580.82.09"}}

``gpu_ids`` is a comma-separated string or a bare number; a ``null`` can stand between tests
(seen in DCGM 3.1's output). dcgmi may print a banner line before the document, and it exits
non-zero when a test fails, so the exit status is not the verdict: the document is. A run that
prints no document at all (timeout, crash, no host engine) is one failed ``dcgm.diag`` check:
the diagnostic was asked for and did not answer, which is not evidence of health.

Statuses: Pass -> pass, Fail -> fail, Warn -> warn, Skip / Not Run -> skip; any other word is a
fail with the word in its message (a renamed status must never read as healthy).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetwatch.validation_wire import CheckResult, CheckStatus

__all__ = ["DcgmDiag", "DiagDocument", "parse_diag_output", "results_of_test", "run_dcgmi_diag"]

logger = logging.getLogger(__name__)

_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
_STATUS: dict[str, CheckStatus] = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
}
_MAX_MESSAGE = 2000


@dataclass
class DiagDocument:
    """What one dcgmi run said: its checks, DCGM's version and the driver it saw."""

    checks: list[CheckResult] = field(default_factory=list)
    version: str | None = None
    driver_version: str | None = None


def parse_diag_output(text: str) -> DiagDocument:
    """The checks in dcgmi's output; ValueError when it holds no diagnostic document."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON document in the dcgmi output")
    try:
        document, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the dcgmi output is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError("the dcgmi document is not a JSON object")
    root_name = next((name for name in _ROOTS if isinstance(document.get(name), dict)), None)
    if root_name is None:
        raise ValueError(f"no {' or '.join(repr(r) for r in _ROOTS)} in the dcgmi document")
    root = document[root_name]
    found_meta = document.get("metadata")
    meta: dict[str, Any] = found_meta if isinstance(found_meta, dict) else {}
    out = DiagDocument(
        version=_text(meta.get("version") or root.get("version")),
        driver_version=_text(
            meta.get("Driver Version Detected")
            or root.get("Driver Version Detected")
            or root.get("driver_version_detected")
        ),
    )
    runtime_error = root.get("runtime_error") or document.get("runtime_error")
    if runtime_error:
        out.checks.append(
            CheckResult(name="dcgm.diag", status="fail", message=_clip(f"{runtime_error}"))
        )
    for category in root.get("test_categories") or []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if isinstance(test, dict):
                out.checks.extend(results_of_test(test))
    if not out.checks:
        raise ValueError("the dcgmi document lists no test results")
    return out


def results_of_test(test: dict[str, Any]) -> Iterator[CheckResult]:
    """One check per GPU (or per entity) that a test object reports on."""
    raw_name = str(test.get("name") or "unnamed")
    name = _check_name(raw_name)
    for result in test.get("results") or []:
        if not isinstance(result, dict):
            continue
        status, word = _status(result.get("status"))
        message = _messages(result, word if status == "fail" and word else None)
        group = result.get("entity_group")
        if group is not None and str(group).upper() != "GPU":
            entity = result.get("entity_id")
            yield CheckResult(
                name=_check_name(f"{raw_name}/{str(group).lower()}{entity}"),
                status=status,
                message=message,
            )
            continue
        for gpu in _gpu_ids(result):
            evidence: dict[str, Any] = {"dcgm_status": _clip(str(result.get("status")))[:64]}
            yield CheckResult(
                name=name, status=status, gpu_index=gpu, evidence=evidence, message=message
            )


class DcgmDiag:
    """Runs ``dcgmi diag`` when it is installed; ``available`` says whether it is."""

    def __init__(self, path: str = "dcgmi", timeout_s: float = 1800.0) -> None:
        self.path = shutil.which(path)
        self.timeout_s = timeout_s

    @property
    def available(self) -> bool:
        return self.path is not None

    def run(self, level: int) -> DiagDocument:
        if self.path is None:
            return DiagDocument(
                checks=[
                    CheckResult(
                        name="dcgm.diag",
                        status="absent",
                        message="dcgmi is not installed on this node",
                    )
                ]
            )
        return run_dcgmi_diag(self.path, level, self.timeout_s)


def run_dcgmi_diag(path: str, level: int, timeout_s: float) -> DiagDocument:
    argv = [path, "diag", "-r", str(level), "-j"]
    logger.info("running %s (timeout %g s)", " ".join(argv), timeout_s)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return _diag_failed(f"dcgmi diag -r {level} did not finish within {timeout_s:g} s")
    except OSError as exc:
        return _diag_failed(f"dcgmi could not run: {exc}")
    try:
        return parse_diag_output(done.stdout)
    except ValueError as exc:
        said = " ".join((done.stderr or done.stdout).split())[:300]
        return _diag_failed(f"dcgmi diag -r {level} exited {done.returncode}: {exc}; {said}")


def _diag_failed(message: str) -> DiagDocument:
    return DiagDocument(checks=[CheckResult(name="dcgm.diag", status="fail", message=message)])


def _status(raw: Any) -> tuple[CheckStatus, str | None]:
    word = str(raw or "").strip()
    known = _STATUS.get(word.lower())
    if known is None:
        return "fail", f"unrecognised DCGM status {word!r}" if word else "no status"
    return known, None


def _gpu_ids(result: dict[str, Any]) -> list[int | None]:
    if "entity_id" in result:
        raw: Any = result["entity_id"]
    else:
        raw = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(raw, bool) or raw is None:
        return [None]
    if isinstance(raw, int):
        return [raw]
    ids = [part.strip() for part in str(raw).split(",") if part.strip()]
    return [int(part) for part in ids if part.isdigit() and int(part) < 1024] or [None]


def _messages(result: dict[str, Any], first: str | None) -> str | None:
    parts = [first] if first else []
    for warning in result.get("warnings") or []:
        if isinstance(warning, dict):
            text = warning.get("warning") or warning.get("message")
        else:
            text = warning
        if text:
            parts.append(str(text))
    return _clip("; ".join(parts)) if parts else None


def _check_name(test: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_.:/ +-" else "_" for c in test.lower())
    return f"dcgm.{cleaned.strip()}"[:128]


def _clip(text: str) -> str:
    text = text.replace("\x00", "")
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _text(value: Any) -> str | None:
    return str(value)[:128] if value not in (None, "") else None
