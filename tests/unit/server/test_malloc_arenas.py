"""The server's limit on glibc malloc arenas, counted by glibc itself (``malloc_stats``) in a
fresh interpreter whose eight threads allocate at once (glibc gives each new thread an arena of
its own while there are fewer than the limit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fleetwatch.server.malloc_arenas import ENVIRONMENT_KEY, limit_malloc_arenas

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's arenas; other platforms are left alone"
)

_PROGRAM = """
import ctypes, sys, threading
from fleetwatch.server.malloc_arenas import limit_malloc_arenas
print(limit_malloc_arenas(int(sys.argv[1])))
barrier = threading.Barrier(9)
held = []
def allocate():
    held.append([bytes(1024) for _ in range(200)])  # over 512 bytes: malloc, not pymalloc
    barrier.wait()  # every thread alive at once, so none inherits an exited one's arena
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
barrier.wait()
ctypes.CDLL(None).malloc_stats()  # to stderr, one "Arena N:" per arena
barrier.wait()
for t in threads:
    t.join()
"""


def _arenas(limit: int, environment: dict[str, str] | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != ENVIRONMENT_KEY}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **(environment or {})},
        check=True,
    )
    return done.stdout.strip(), len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))


def test_eight_threads_share_two_arenas_once_limited() -> None:
    assert _arenas(2) == ("True", 2)


def test_without_the_limit_each_thread_gets_an_arena() -> None:
    limited, arenas = _arenas(0)
    assert limited == "False"
    assert arenas > 2  # the main arena and one per thread, up to glibc's 8 per core


def test_an_operators_own_setting_wins() -> None:
    limited, arenas = _arenas(2, {ENVIRONMENT_KEY: "4"})
    assert limited == "False"
    assert arenas == 4  # glibc applied the operator's 4 at start


def test_the_limit_is_passed_to_the_processes_the_server_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENVIRONMENT_KEY, "restored after the test")  # whatever it was before
    monkeypatch.delenv(ENVIRONMENT_KEY)
    # Limits this test process too: harmless, and what the server command does to itself.
    assert limit_malloc_arenas(2)
    assert os.environ[ENVIRONMENT_KEY] == "2"
