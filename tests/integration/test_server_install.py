"""`pip install 'fleetwatch[server]'` alone gives a server that starts and answers ready.

The server scores risk (numpy, pandas, scipy, scikit-learn) and refits its models (lifelines) in
the background, so its extra must bring them: a fresh virtualenv with that extra alone must run
`fleetwatch server` on SQLite. Installed the way the agent's install test does (the local
checkout, pip's configured wheel sources; nothing goes into the project's own environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.live import free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]
# The virtualenv's own site-packages only: a PYTHONPATH pointing at the checkout would hide a gap.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.slow
def test_server_extra_alone_starts_the_server_on_sqlite(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # Without a pip of its own (ensurepip cost 3.5 s of CPU): this process's pip installs into
    # it (--python), and the server needs no pip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin/python")
    pip_in_venv = [sys.executable, "-m", "pip", "--python", python]
    pip = subprocess.run(
        # --no-compile: the byte-compiling of every installed module is most of pip's time here,
        # and Python compiles what the server imports as it imports it.
        [*pip_in_venv, "install", "--quiet", "--no-compile", f"{REPO}[server]"],
        capture_output=True,
        text=True,
        timeout=600,
        env=CLEAN_ENV,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    installed = subprocess.run(
        [*pip_in_venv, "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=CLEAN_ENV,
    )
    names = {p["name"].lower().replace("_", "-") for p in json.loads(installed.stdout)}
    # What the server imports, and nothing of the agent's NVML binding or the report's PDF.
    wanted = {"fastapi", "sqlalchemy", "numpy", "pandas", "scipy", "scikit-learn", "lifelines"}
    assert wanted <= names, sorted(names)
    assert not names & {"nvidia-ml-py", "weasyprint"}
    # The scheduled refit imports its fitters only when it runs: they must be there too.
    fitters = subprocess.run(
        [python, "-c", "import fleetwatch.models.weibull, fleetwatch.models.aft"],
        capture_output=True,
        text=True,
        timeout=120,
        env=CLEAN_ENV,
    )
    assert fitters.returncode == 0, fitters.stderr[-2000:]

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                str(venv / "bin/fleetwatch"),
                "server",
                "--port",
                str(port),
                "--database-url",
                f"sqlite:///{tmp_path / 'fleetwatch.db'}",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=CLEAN_ENV,  # not the checkout: the installed package must be the one imported
        )
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}", process, log)
    finally:
        process.terminate()
        process.wait(timeout=20)
    output = log.read_text()
    assert ready.get("status") == "ready", output[-3000:]
    assert "Traceback" not in output, output[-3000:]
