"""The systemd units in deploy/systemd/ start commands FleetWatch has, with settings it has.

Each unit's ExecStart is parsed by FleetWatch's own CLI (a misspelt flag fails here, not at
3 a.m. on a node), each name in the example environment files is a real setting, and
`systemd-analyze verify` (Debian's systemd, the real parser) accepts the unit files where it is
installed. Real parts: the CLI and systemd's own parser; nothing is started.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.cli_check import is_setting, parse_args

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
AGENT_TOML = REPO / "deploy" / "agent.toml"


def _directives(unit: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


@pytest.mark.parametrize("unit", sorted(p.name for p in UNITS.glob("*.service")))
def test_each_units_command_parses_with_the_cli(unit: str) -> None:
    # The agent's --config must exist to parse: the commented example that goes there.
    exec_start = _directives(UNITS / unit)["ExecStart"]
    command = shlex.split(exec_start.replace("/etc/fleetwatch/agent.toml", str(AGENT_TOML)))
    assert Path(command[0]).name == "fleetwatch", command
    parse_args(command[1:])  # raises on an unknown command or flag


def test_a_misspelt_flag_in_a_unit_would_fail() -> None:
    with pytest.raises(Exception, match="--intervall"):
        parse_args(["slurm-sync", "--intervall", "5"])


@pytest.mark.parametrize("env_file", sorted(p.name for p in UNITS.glob("*.env")))
def test_each_example_environment_names_real_settings(env_file: str) -> None:
    names = [
        line.lstrip("#").split("=", 1)[0]
        for line in (UNITS / env_file).read_text().splitlines()
        if line.lstrip("#").startswith("FLEETWATCH_")
    ]
    assert names
    for name in names:
        assert is_setting(name), (env_file, name)


def test_every_unit_reads_the_environment_file_it_documents() -> None:
    for unit in UNITS.glob("*.service"):
        env = _directives(unit).get("EnvironmentFile")
        if env is not None:
            assert (UNITS / Path(env).name).exists(), (unit.name, env)


def _systemd_problems(units: list[Path], where: Path) -> list[str]:
    """What `systemd-analyze verify` says is wrong in copies of ``units`` (its parser's own
    complaints: outside a booted systemd the users, environment files and ordering targets of a
    real host are missing, which is not what this checks)."""
    # verify checks that ExecStart's binary exists: the copies point at one that does.
    fleetwatch = shutil.which("fleetwatch") or "/bin/true"
    for unit in units:
        (where / unit.name).write_text(
            unit.read_text().replace("/usr/local/bin/fleetwatch", fleetwatch)
        )
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(where / u.name) for u in units)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    markers = ("Unknown", "Invalid", "Failed to parse")
    return [line for line in done.stderr.splitlines() if any(m in line for m in markers)]


NO_SYSTEMD = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="no systemd-analyze here"
)


@NO_SYSTEMD
def test_systemd_accepts_the_unit_files(tmp_path: Path) -> None:
    assert _systemd_problems(sorted(UNITS.glob("*.service")), tmp_path) == []


@NO_SYSTEMD
def test_systemd_analyze_catches_a_misspelt_directive(tmp_path: Path) -> None:
    broken = tmp_path / "src" / "fleetwatch-broken.service"
    broken.parent.mkdir()
    text = (UNITS / "fleetwatch-server.service").read_text()
    broken.write_text(text.replace("RestartSec=5", "RestartSecs=5"))
    (tmp_path / "out").mkdir()
    problems = _systemd_problems([broken], tmp_path / "out")
    assert len(problems) == 1 and "RestartSecs" in problems[0], problems
