"""The validation result on the wire: what ``fleetwatch validate`` pushes, what the server keeps.

Shared by the agent (which builds it) and the server (which checks and stores it), as
:mod:`fleetwatch.telemetry` is for batches. A result is a list of checks, each one named, for one
GPU or the whole node, with one status::

    pass    measured, and within bounds
    fail    measured, and out of bounds (or the tool said so)
    warn    measured, worth a look, not a reason to keep the node out (e.g. DCGM's own warnings)
    skip    the tool chose not to run it (DCGM "Skip" / "Not Run")
    absent  this GPU or driver cannot give the reading: never counted as a pass

The verdict (:func:`verdict`) is computed, never sent: a result passes when no check failed and at
least one check passed (a result with nothing measured proves nothing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fleetwatch.telemetry import _NODE_NAME_RE, _UUID_RE

__all__ = [
    "MAX_CHECKS",
    "STATUSES",
    "CheckResult",
    "CheckStatus",
    "ValidationReport",
    "failed_checks",
    "verdict",
]

CheckStatus = Literal["pass", "fail", "warn", "skip", "absent"]
STATUSES: tuple[str, ...] = CheckStatus.__args__  # type: ignore[attr-defined]
# 8 GPUs x (7 NVML checks + ~40 DCGM tests) is about 400: a runaway list is refused, and with the
# bounds below a body stays under ~20 MB even at its worst.
MAX_CHECKS = 2048
_MAX_EVIDENCE_KEYS = 32
_MAX_EVIDENCE_TEXT = 256
_MAX_TEXT = 2000

_Scalar = int | float | bool | str | None


def _clean_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode: a lone surrogate") from None
    return value


_Text = Annotated[str, AfterValidator(_clean_text)]


def _check_evidence(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > _MAX_EVIDENCE_KEYS:
        raise ValueError(f"at most {_MAX_EVIDENCE_KEYS} evidence values")
    for key, item in value.items():
        _clean_text(key)
        if not 1 <= len(key) <= 64:
            raise ValueError("evidence names are 1 to 64 characters")
        if isinstance(item, str):
            _clean_text(item)
            if len(item) > _MAX_EVIDENCE_TEXT:
                raise ValueError(f"evidence {key!r} is longer than {_MAX_EVIDENCE_TEXT} characters")
        elif item is not None and not isinstance(item, int | float | bool):
            raise ValueError(f"evidence {key!r} must be a number, a boolean, text or null")
    return value


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckResult(_Wire):
    """One check, on one GPU (``gpu_index``/``gpu_uuid``) or on the node (both null)."""

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_.:/ +-]{0,127}$",
        description="nvml.<check> or dcgm.<test>, e.g. nvml.remapped_rows, dcgm.memory",
    )
    status: CheckStatus
    gpu_index: int | None = Field(default=None, ge=0, le=1023)
    gpu_uuid: str | None = Field(default=None, pattern=_UUID_RE)
    evidence: Annotated[dict[str, _Scalar], AfterValidator(_check_evidence)] = Field(
        default_factory=dict, description="the values the status was decided on"
    )
    message: _Text | None = Field(default=None, max_length=_MAX_TEXT)

    @property
    def label(self) -> str:
        """``nvml.ecc_volatile on GPU 3``: how a person reads a failed check."""
        return self.name if self.gpu_index is None else f"{self.name} on GPU {self.gpu_index}"


class ValidationReport(_Wire):
    """One ``fleetwatch validate`` run on one node."""

    node: str = Field(pattern=_NODE_NAME_RE)
    started_at: datetime
    finished_at: datetime
    checks: list[CheckResult] = Field(min_length=1, max_length=MAX_CHECKS)
    tools: dict[str, _Text] = Field(
        default_factory=dict,
        max_length=16,
        description="versions: fleetwatch, driver, nvml, dcgm (those that were used)",
    )
    dcgm_level: int | None = Field(default=None, ge=1, le=4)
    duration_s: float = Field(ge=0, le=86400, description="seconds between the two NVML reads")

    @model_validator(mode="after")
    def _ordered(self) -> ValidationReport:
        if self.started_at.tzinfo is None or self.finished_at.tzinfo is None:
            raise ValueError("started_at and finished_at need a UTC offset")
        if self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        for key, value in self.tools.items():
            if len(key) > 32 or len(value) > 128:
                raise ValueError("tool names are at most 32 characters, versions 128")
        return self

    @property
    def passed(self) -> bool:
        return verdict(self.checks)


def verdict(checks: list[CheckResult]) -> bool:
    """Passed: no check failed and at least one passed."""
    return not failed_checks(checks) and any(c.status == "pass" for c in checks)


def failed_checks(checks: list[CheckResult]) -> list[str]:
    """The failed checks' labels, in order, each once."""
    return list(dict.fromkeys(c.label for c in checks if c.status == "fail"))
