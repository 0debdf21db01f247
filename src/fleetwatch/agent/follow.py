"""Following a growing log file the way ``tail -F`` does: by name, through rotation and truncation.

The position (inode and offset) can be saved to a state file, so that an agent restart resumes
where it stopped: no line is read twice, none skipped while the agent was down.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["FileFollower"]


class FileFollower:
    """``read_lines()`` returns the complete lines appended since the last call."""

    def __init__(self, path: Path, *, state_file: Path | None = None, from_start: bool = False):
        self.path = path
        self._state_file = state_file
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        saved = self._load_state()
        if saved is not None:
            self._inode, self._offset = saved
        elif not from_start:
            # A fresh agent starts at the end: old lines were someone else's to report.
            try:
                st = path.stat()
                self._inode, self._offset = st.st_ino, st.st_size
            except FileNotFoundError:
                pass

    def _load_state(self) -> tuple[int, int] | None:
        if self._state_file is None or not self._state_file.exists():
            return None
        try:
            data = json.loads(self._state_file.read_text())
            if data.get("path") != str(self.path):
                return None
            return int(data["inode"]), int(data["offset"])
        except (ValueError, KeyError, OSError):
            return None

    def _save_state(self) -> None:
        if self._state_file is None or self._inode is None:
            return
        tmp = self._state_file.with_suffix(".tmp")
        # A partial last line is not consumed yet: a restart must read it again, whole.
        offset = self._offset - len(self._partial)
        tmp.write_text(json.dumps({"path": str(self.path), "inode": self._inode, "offset": offset}))
        os.replace(tmp, self._state_file)

    def read_lines(self) -> list[str]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []  # rotated away and not yet recreated
        lines: list[str] = []
        if self._inode is not None and st.st_ino != self._inode:
            # Rotated: lines appended to the old file after our last read are in its renamed
            # copy, if it is beside it.
            lines += self._drain_rotated()
            self._inode, self._offset, self._partial = st.st_ino, 0, b""
        elif st.st_size < self._offset:
            # Truncated in place (copytruncate): start over from the top.
            self._offset, self._partial = 0, b""
        self._inode = st.st_ino
        if st.st_size > self._offset:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read(st.st_size - self._offset)
            self._offset += len(chunk)
            lines += self._split(chunk)
            self._save_state()
        return lines

    def _drain_rotated(self) -> list[str]:
        """logrotate's default renames the file to <name>.1; read what we had not read yet."""
        rotated = self.path.with_name(self.path.name + ".1")
        try:
            st = rotated.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != self._inode or st.st_size <= self._offset:
            return []
        with rotated.open("rb") as f:
            f.seek(self._offset)
            return self._split(f.read())

    def _split(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in complete]
