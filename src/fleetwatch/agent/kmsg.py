"""Line sources for the kernel log: a file, ``/dev/kmsg``, or ``journalctl -k -f``.

Each offers ``read_lines()`` (what appeared since the last call, never blocking) and ``close()``,
and remembers where it stopped in a state file so that an agent restart neither repeats nor
skips a line.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Protocol

from fleetwatch.agent.follow import FileFollower
from fleetwatch.errors import CollectorError

__all__ = ["JournalSource", "KmsgSource", "LineSource", "open_kernel_log"]


class LineSource(Protocol):
    def read_lines(self) -> list[str]: ...

    def close(self) -> None: ...


class _FileSource:
    def __init__(self, path: Path, state_dir: Path | None) -> None:
        state = state_dir / "kernel-log.position.json" if state_dir else None
        self._follower = FileFollower(path, state_file=state)

    def read_lines(self) -> list[str]:
        return self._follower.read_lines()

    def close(self) -> None:
        pass


class KmsgSource:
    """``/dev/kmsg`` records (``pri,seq,usec,flags;message``), resumed by sequence number."""

    def __init__(self, path: Path = Path("/dev/kmsg"), state_dir: Path | None = None) -> None:
        self._state = state_dir / "kmsg.seq" if state_dir else None
        self._last_seq = self._load_seq()
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise CollectorError(f"cannot read {path}: {exc}") from exc
        if self._last_seq is None:
            os.lseek(self._fd, 0, os.SEEK_END)  # first start: only what happens from now on

    def _load_seq(self) -> int | None:
        try:
            return int(self._state.read_text()) if self._state else None
        except (OSError, ValueError):
            return None

    def read_lines(self) -> list[str]:
        lines: list[str] = []
        last = self._last_seq
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # the ring buffer overwrote records we had not read; go on
                raise CollectorError(f"reading /dev/kmsg failed: {exc}") from exc
            if not record:
                break
            text = record.decode("utf-8", errors="replace").rstrip("\n")
            header = text.split(";", 1)[0].split(",")
            seq = int(header[1]) if len(header) > 1 and header[1].isdigit() else None
            if seq is not None and last is not None and seq <= last:
                continue
            if seq is not None:
                last = seq
            lines.append(text.split("\n", 1)[0])
        if last is not None and last != self._last_seq and self._state is not None:
            self._state.write_text(str(last))
        self._last_seq = last
        return lines

    def close(self) -> None:
        os.close(self._fd)


class JournalSource:
    """``journalctl -k -f``, resumed with journalctl's own cursor file."""

    def __init__(self, state_dir: Path | None = None) -> None:
        command = ["journalctl", "-k", "-f", "-o", "short-iso", "--no-pager"]
        if state_dir is not None:
            command.append(f"--cursor-file={state_dir / 'journal.cursor'}")
        else:
            command += ["-n", "0"]
        try:
            self._process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError as exc:
            raise CollectorError(f"cannot run journalctl: {exc}") from exc
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, name="journalctl", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))

    def read_lines(self) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(self._lines.get_nowait())
            except queue.Empty:
                return lines

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=5)


def open_kernel_log(spec: str, state_dir: Path | None) -> LineSource:
    """``auto`` prefers /dev/kmsg, then journalctl; anything else names a mode or a file."""
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
    if spec == "kmsg" or (spec == "auto" and os.access("/dev/kmsg", os.R_OK)):
        return KmsgSource(state_dir=state_dir)
    if spec == "journal" or (spec == "auto" and shutil.which("journalctl")):
        return JournalSource(state_dir)
    if spec == "auto":
        raise CollectorError("no kernel log: /dev/kmsg is not readable and journalctl is absent")
    return _FileSource(Path(spec), state_dir)
