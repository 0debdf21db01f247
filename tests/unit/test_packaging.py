"""The product card: parts where a newcomer looks, lean agent extras, the container image's
definition (the Compose file: see test_compose.py; the image run: tests/integration/
test_image_podman.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.dockerfile import read_dockerfile

from fleetwatch.healthcheck import probe_url

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


def test_dockerfile_declares_what_the_helm_chart_and_compose_rely_on() -> None:
    config = read_dockerfile().config
    assert config["User"] == "10001:10001"  # numeric: runAsNonRoot can check it
    assert config["Entrypoint"] == ["fleetwatch"]
    assert config["Cmd"] == ["server", "--host", "0.0.0.0"]
    assert config["ExposedPorts"] == {"8400/tcp": {}}
    assert config["WorkingDir"] == "/var/lib/fleetwatch"  # the default SQLite file's directory
    # The probe reads the port and whether TLS is on from the server's environment.
    assert config["Healthcheck"]["Test"] == [
        "CMD", "/opt/fleetwatch/bin/python", "-m", "fleetwatch.healthcheck"
    ]  # fmt: skip


def test_the_health_probe_follows_the_servers_port_and_tls() -> None:
    assert probe_url({}) == "http://127.0.0.1:8400/healthz"
    assert probe_url({"FLEETWATCH_SERVER_PORT": "9000"}) == "http://127.0.0.1:9000/healthz"
    tls = {"FLEETWATCH_SERVER_TLS_CERT": "/tls/tls.crt", "FLEETWATCH_SERVER_PORT": "8443"}
    assert probe_url(tls) == "https://127.0.0.1:8443/healthz"


def test_build_image_script_makes_the_dockerfiles_base() -> None:
    """scripts/build-image.sh (no registry) reads the suite and packages from the Dockerfile,
    whose default base is debian:<suite>-slim: both images start from the same Debian."""
    dockerfile = read_dockerfile()
    printed = subprocess.run(
        [str(REPO / "scripts/build-image.sh"), "--print-base"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    base = dict(line.split("=", 1) for line in printed.splitlines())
    assert base["suite"] == dockerfile.debian_suite
    assert base["packages"] == dockerfile.args["DEBIAN_PACKAGES"]
    assert base["image"].startswith(f"localhost/fleetwatch-base:{dockerfile.debian_suite}-")


def test_image_requirements_are_the_packages_the_images_extras_and_the_build_backend() -> None:
    extras = read_dockerfile().args["EXTRAS"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    listed = _image_requirements(extras)
    assert listed.returncode == 0, listed.stderr
    wanted = list(project["dependencies"])
    for extra in extras.split(","):
        wanted += project["optional-dependencies"][extra]
    assert listed.stdout.splitlines() == list(dict.fromkeys(wanted))
    unknown = _image_requirements("server,gui")
    assert unknown.returncode == 1 and "no extra gui" in unknown.stderr
    backend = _image_requirements("--build").stdout.splitlines()
    assert backend == pyproject["build-system"]["requires"]


def _image_requirements(extras: str) -> subprocess.CompletedProcess[str]:
    script = REPO / "deploy/image/requirements.py"
    return subprocess.run(
        [sys.executable, str(script), str(REPO / "pyproject.toml"), extras],
        capture_output=True,
        text=True,
    )
