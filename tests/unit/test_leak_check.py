"""tests/leak_check.py: a leaked object's ResourceWarning fails the test that leaked it.

Run in a pytest of its own (a subprocess): a test leaves a reference cycle whose finaliser warns,
as an engine nobody disposed warns for its open connection, and the next test makes enough
garbage for the collector to run on its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LEAKY_TESTS = """
import warnings


class Leaky:
    def __init__(self):
        self.cycle = self  # freed only by the cyclic collector

    def __del__(self):
        warnings.warn("Leaky was deleted while still open", ResourceWarning)


def test_leaks():
    Leaky()


def test_innocent():
    kept = [[] for _ in range(100_000)]  # enough new objects to set off a collection here
    assert len(kept) == 100_000
"""


def _outcomes(tmp_path: Path, *plugin: str) -> dict[str, str]:
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            "-rA",
            "-q",
            *plugin,
            "test_leaky.py",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    found: dict[str, str] = {}
    for line in run.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            name = rest.split("::")[1].split(" ")[0]
            found[name] = "ERROR" if "ERROR" in (found.get(name), word) else word
    return found


def test_the_leak_fails_the_test_that_leaked(tmp_path: Path) -> None:
    outcomes = _outcomes(tmp_path, "-p", "tests.leak_check")
    assert outcomes == {"test_leaks": "ERROR", "test_innocent": "PASSED"}, outcomes


def test_without_it_the_leak_fails_an_innocent_test(tmp_path: Path) -> None:
    # What the hook is for: pytest alone blames whichever test the collector next runs in.
    outcomes = _outcomes(tmp_path)
    assert outcomes["test_leaks"] == "PASSED", outcomes
    assert outcomes["test_innocent"] in ("FAILED", "ERROR"), outcomes
