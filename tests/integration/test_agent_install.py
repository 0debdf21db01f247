"""`pip install 'fleetwatch[agent]'` alone gives a working agent, and nothing of the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_agent_extra_alone_runs_the_agent_and_refuses_the_server_clearly(
    tmp_path: Path, shared_dir: Path
) -> None:
    venv = tmp_path / "venv"
    # Without a pip of its own (ensurepip cost 3.5 s of CPU): this process's pip installs into
    # it (--python), and the agent needs no pip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip_in_venv = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python")]
    pip = subprocess.run(
        [*pip_in_venv, "install", "--quiet", f"{REPO}[agent]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    installed = subprocess.run(
        [*pip_in_venv, "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = {p["name"].lower().replace("_", "-") for p in json.loads(installed.stdout)}
    assert {"nvidia-ml-py", "httpx", "prometheus-client", "fleetwatch"} <= names
    assert not names & {
        "fastapi",
        "sqlalchemy",
        "alembic",
        "psycopg",
        "uvicorn",
        "lifelines",
        "pandas",
        "numpy",
    }
    xml = shared_dir / "fixtures/nvidia_smi/xml/telegraf__a100-sxm4-v12.xml"
    dry = subprocess.run(
        [
            str(venv / "bin/fleetwatch"),
            "agent",
            "--once",
            "--dry-run",
            "--collectors",
            "nvidia-smi",
            "--nvidia-smi",
            str(xml),
            "--node-name",
            "n1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["samples"][0]["uuid"].startswith("GPU-")
    server = subprocess.run(
        [str(venv / "bin/fleetwatch"), "server"], capture_output=True, text=True, timeout=60
    )
    assert server.returncode == 3
    assert "fleetwatch[server]" in server.stderr and "Traceback" not in server.stderr
