"""Captured ``/sys/class/infiniband`` trees from ``../shared/fixtures/infiniband``, unpacked into a
test's tmp_path: a ``git archive`` tar (GPUd's H100 node) and a ttar text archive (procfs').

ttar, as the file itself shows it: records separated by ``# ttar - - -`` lines;
``Directory: <path>`` then ``Mode: <octal>``; ``Path: <path>``, ``Lines: <n>``, the file's n
lines, then ``Mode: <octal>``. A last line ending in ``EOF`` marks a file without a final newline
(the marker is not content); ``SymlinkTo: <target>`` makes a link.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

H100_TAR = "infiniband/gpud__sys-class-infiniband-h100_tree.tar"
H100_TREE = "components/accelerator/nvidia/infiniband/class/testdata/sys-class-infiniband-h100.0"
PROCFS_TTAR = "infiniband/prometheus-procfs__sysfs-class-infiniband_hfi1-mlx4-mlx5.ttar"
PROCFS_TREE = "fixtures/sys/class/infiniband"


def unpack_tar(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def unpack_ttar(archive: Path, dest: Path) -> Path:
    """Write the files and directories of a ttar archive under ``dest``."""
    lines = archive.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith(("# ttar", "Mode: ")):
            continue
        key, _, value = line.partition(": ")
        if key == "Directory":
            (dest / value).mkdir(parents=True, exist_ok=True)
        elif key == "Path":
            count_key, _, count = lines[i].partition(": ")
            if count_key != "Lines":
                raise ValueError(f"ttar line {i + 1}: expected 'Lines: <n>', got {lines[i]!r}")
            body = lines[i + 1 : i + 1 + int(count)]
            i += 1 + int(count)
            text = "".join(f"{b}\n" for b in body)
            if text.endswith("EOF\n"):
                text = text.removesuffix("EOF\n")
            target = dest / value
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        elif key == "SymlinkTo":
            raise ValueError(f"ttar line {i}: links are not needed by these trees")
        else:
            raise ValueError(f"ttar line {i}: unexpected {line!r}")
    return dest


def h100_tree(fixtures_dir: Path, tmp_path: Path) -> Path:
    return unpack_tar(fixtures_dir / H100_TAR, tmp_path / "h100") / H100_TREE


def procfs_tree(fixtures_dir: Path, tmp_path: Path) -> Path:
    return unpack_ttar(fixtures_dir / PROCFS_TTAR, tmp_path / "procfs") / PROCFS_TREE
