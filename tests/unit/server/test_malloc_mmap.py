"""The server's fixed glibc mmap threshold, counted by glibc itself (``malloc_stats``' "max mmap
regions") in a fresh interpreter: a 16 MiB block freed raises glibc's own threshold to 16 MiB,
so ten 4 MiB blocks come from the heap; with the threshold fixed each gets a mapping of its own
(returned to the system when it is freed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fleetwatch.server.malloc_mmap import ENVIRONMENT_KEY, fix_mmap_threshold

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's malloc; other platforms are left alone"
)

_PROGRAM = """
import ctypes, sys
from fleetwatch.server.malloc_mmap import fix_mmap_threshold
print(fix_mmap_threshold(int(sys.argv[1])))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # glibc's own rule: the threshold follows a freed block's size
held = [libc.malloc(4 << 20) for _ in range(10)]
libc.malloc_stats()  # to stderr
for block in held:
    libc.free(block)
"""


def _mapped_regions(threshold: int, environment: dict[str, str] | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != ENVIRONMENT_KEY}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(threshold)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **(environment or {})},
        check=True,
    )
    found = re.search(r"max mmap regions\s*=\s*(\d+)", done.stderr)
    assert found, done.stderr
    return done.stdout.strip(), int(found.group(1))


def test_with_the_threshold_fixed_every_large_block_is_mapped() -> None:
    fixed, regions = _mapped_regions(256 * 1024)
    assert fixed == "True"
    assert regions >= 10  # the ten 4 MiB blocks held at once, each a mapping


def test_glibcs_own_threshold_moves_them_into_the_heap() -> None:
    fixed, regions = _mapped_regions(0)
    assert fixed == "False"
    assert regions < 10  # only the 16 MiB block was mapped


def test_an_operators_own_setting_wins() -> None:
    fixed, regions = _mapped_regions(256 * 1024, {ENVIRONMENT_KEY: str(8 << 20)})
    assert fixed == "False"
    assert regions < 10  # the operator's 8 MiB: none of the 4 MiB blocks mapped


def test_the_threshold_is_passed_to_the_processes_the_server_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENVIRONMENT_KEY, "restored after the test")  # whatever it was before
    monkeypatch.delenv(ENVIRONMENT_KEY)
    # Sets this test process's threshold too: harmless, and what the server command does.
    assert fix_mmap_threshold(256 * 1024)
    assert os.environ[ENVIRONMENT_KEY] == str(256 * 1024)
