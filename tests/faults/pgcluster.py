"""A throwaway PostgreSQL cluster of a test's own: initdb into a temporary directory, its own
port and socket directory, started, restarted (``fast`` or ``immediate``, the latter a crash
and recovery) and removed. Never the shared server at 5432, which other tests run against.

As root the binaries run as the ``postgres`` OS user (PostgreSQL refuses to run as root), in a
directory that user owns; as anyone else they run as that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.integration.live import free_port

__all__ = ["PgCluster", "pg_bindir", "throwaway_cluster"]

Mode = Literal["smart", "fast", "immediate"]


def pg_bindir() -> Path:
    """Where initdb and pg_ctl are; a skip (a failure under FLEETWATCH_REQUIRE_TOOLS=1) if none."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    found = shutil.which("pg_ctl") or (candidates[0] if candidates else None)
    if found is None:
        message = "pg_ctl not found: install the PostgreSQL server package"
        if os.environ.get("FLEETWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return Path(found).parent


@dataclass
class PgCluster:
    root: Path  # data/, the socket and the log live here
    port: int
    bindir: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._pg_ctl("start", "-o", self._options())

    def stop(self, mode: Mode = "fast") -> None:
        self._pg_ctl("stop", "-m", mode)

    def restart(self, mode: Mode = "fast") -> None:
        """Stop with ``mode`` (``immediate``: no checkpoint, crash recovery at start) and start."""
        self._pg_ctl("restart", "-m", mode, "-o", self._options())

    def _options(self) -> str:
        return f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"

    def _pg_ctl(self, *args: str) -> None:
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log)]
        done = subprocess.run(
            _as_owner([*command, "-w", "-t", "120", *args]),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise AssertionError(f"pg_ctl {' '.join(args)} failed: {done.stderr}\n{log[-3000:]}")


@contextmanager
def throwaway_cluster() -> Iterator[PgCluster]:
    """A started cluster with trust auth for ``postgres`` on 127.0.0.1; removed afterwards."""
    bindir = pg_bindir()
    root = Path(tempfile.mkdtemp(prefix="fleetwatch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres", group="postgres")
    cluster = PgCluster(root=root, port=free_port(), bindir=bindir)
    try:
        subprocess.run(
            _as_owner([str(bindir / "initdb"), "-D", str(cluster.data_dir), "-U", "postgres",
                       "-A", "trust", "--no-sync", "-E", "UTF8"]),
            capture_output=True, text=True, timeout=180, check=True,
        )  # fmt: skip
        cluster.start()
        try:
            yield cluster
        finally:
            _stop_quietly(cluster)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _stop_quietly(cluster: PgCluster) -> None:
    try:
        cluster.stop("immediate")
    except AssertionError:  # already down: the directory goes anyway
        pass
