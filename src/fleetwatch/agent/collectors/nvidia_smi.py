"""``nvidia-smi -q -x``: the fallback that needs no Python bindings, only the driver's tool."""

from __future__ import annotations

import shlex
import subprocess
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from fleetwatch.agent.collectors.base import Collection, readings_to_collection
from fleetwatch.agent.parsers import ParseError
from fleetwatch.agent.parsers.nvidia_smi_xml import parse_nvidia_smi_xml
from fleetwatch.errors import CollectorError

__all__ = ["NvidiaSmiCollector"]


class NvidiaSmiCollector:
    name: ClassVar[str] = "nvidia-smi"

    def __init__(self, source: str, *, timeout_s: float = 20.0) -> None:
        # A path to a saved XML is read as it is; anything else is the command to run.
        self._file = Path(source) if Path(source).is_file() else None
        self._command = shlex.split(source)
        self._timeout_s = timeout_s

    def _read(self) -> str:
        if self._file is not None:
            return self._file.read_text()
        try:
            done = subprocess.run(
                self._command,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CollectorError(f"running {' '.join(self._command)} failed: {exc}") from exc
        if done.returncode != 0:
            raise CollectorError(
                f"{' '.join(self._command)} exited {done.returncode}: {done.stderr.strip()[:300]}"
            )
        return done.stdout

    def collect(self, now: datetime) -> Collection:
        try:
            return readings_to_collection(parse_nvidia_smi_xml(self._read()), now)
        except ParseError as exc:
            raise CollectorError(f"nvidia-smi output unreadable: {exc}") from exc

    def close(self) -> None:
        pass
