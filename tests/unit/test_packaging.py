"""The product card: parts where a newcomer looks, lean agent extras (the Compose file: see
test_compose.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_layout_shows_every_part_of_the_product_card() -> None:
    for part in (
        "src/fleetwatch/agent",
        "src/fleetwatch/server",
        "src/fleetwatch/models",
        "src/fleetwatch/migrations",
        "dashboards",
        "tests",
        "docker-compose.yml",
        "pyproject.toml",
        "README.md",
        "Makefile",
        ".ci/run",
    ):
        assert (REPO / part).exists(), part


def test_readme_opens_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text().split("## ", 3)
    assert "make demo" in head[1] + head[2] and "make test" in head[1] + head[2]


def test_agent_extra_carries_no_server_or_model_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    agent = " ".join(project["optional-dependencies"]["agent"] + project["dependencies"])
    for heavy in ("fastapi", "sqlalchemy", "alembic", "psycopg", "lifelines", "pandas", "uvicorn"):
        assert heavy not in agent, heavy
    assert project["scripts"] == {"fleetwatch": "fleetwatch.cli:main"}


def test_agent_modules_import_without_server_modules() -> None:
    code = (
        "import sys, fleetwatch.telemetry, fleetwatch.agent.parsers.nvidia_smi_xml, "
        "fleetwatch.agent.parsers.kernel_log, fleetwatch.agent.parsers.dcgm_exporter, "
        "fleetwatch.cli, fleetwatch.agent.factory, fleetwatch.agent.loop, "
        "fleetwatch.agent.collectors.kernel_log, fleetwatch.agent.collectors.dcgm_exporter, "
        "fleetwatch.agent.collectors.nvidia_smi, fleetwatch.agent.collectors.nvml, "
        "fleetwatch.client, fleetwatch.client.steps, fleetwatch.agent.validate, "
        "fleetwatch.agent.dcgm_diag, fleetwatch.cli.validate_cmd, fleetwatch.validation_wire;"
        "heavy = [m for m in ('fastapi', 'sqlalchemy', 'alembic', 'psycopg', 'lifelines', 'numpy', "
        "'pandas') "
        "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
