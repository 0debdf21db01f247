"""``fleetwatch validate``: run the return-to-service checks on this node and push the result.

Exit status: 0 the node passed and the result was pushed; 1 it failed (pushed); 4 the result
could not be pushed (it is printed, as JSON, so nothing is lost); 3 NVML is not available.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from fleetwatch.cli.tls_options import client_tls_options
from fleetwatch.config import load_agent_settings
from fleetwatch.errors import FleetWatchError

__all__ = ["validate"]

EXIT_FAILED = 1
EXIT_NO_NVML = 3
EXIT_NOT_PUSHED = 4


class _NotPushed(click.ClickException):
    exit_code = EXIT_NOT_PUSHED


class _NoNvml(click.ClickException):
    exit_code = EXIT_NO_NVML


@click.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, path_type=Path),
    help="The agent's TOML file (server_url, token_file, node_name are read from it)",
)
@click.option("--server", "server_url", help="FleetWatch server, e.g. https://fleetwatch:8400")
@click.option("--token", help="Agent token (prefer --token-file or FLEETWATCH_AGENT_TOKEN)")
@click.option("--token-file", type=click.Path(path_type=Path))
@click.option("--node-name", help="Default: the hostname")
@client_tls_options(shared_env=False)
@click.option(
    "--allow-insecure-http",
    is_flag=True,
    default=None,
    help="Send the token over plain http:// to another machine, as the agent's setting",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(0, 3600),
    default=30.0,
    show_default=True,
    help="Seconds between the two NVML reads (ECC counters must not rise in between)",
)
@click.option(
    "--dcgm-level",
    type=click.IntRange(1, 4),
    default=1,
    show_default=True,
    help="dcgmi diag -r LEVEL, when dcgmi is installed",
)
@click.option("--no-dcgm", is_flag=True, help="Do not run dcgmi diag even when installed")
@click.option(
    "--dcgm-timeout",
    "dcgm_timeout_s",
    type=click.FloatRange(1, 86400),
    default=1800.0,
    show_default=True,
    help="Seconds dcgmi diag may take before it counts as failed",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON")
@click.option("--no-push", is_flag=True, help="Run and print only")
@click.option("--fake-nvml", type=click.Path(exists=True, path_type=Path), hidden=True)
def validate(
    config_file: Path | None,
    duration_s: float,
    dcgm_level: int,
    no_dcgm: bool,
    dcgm_timeout_s: float,
    as_json: bool,
    no_push: bool,
    fake_nvml: Path | None,
    **flags: Any,
) -> None:
    """Check this node's GPUs (NVML health, and dcgmi diag when installed) and push the result.

    A node evicted for a hardware reason returns to service only after a passing result newer
    than its eviction reached the server (POST /v1/nodes/NAME/return answers 409 until then).
    """
    from fleetwatch.agent.dcgm_diag import DcgmDiag
    from fleetwatch.agent.nvml import Nvml
    from fleetwatch.agent.validate import run_validation

    settings = load_agent_settings(config_file, **flags)
    lib: Any = None
    if fake_nvml is not None:  # tests: a recorded node instead of the driver
        from fleetwatch.testing import FakePynvml

        lib = FakePynvml.from_json(fake_nvml)
    dcgm = None if no_dcgm else DcgmDiag(timeout_s=dcgm_timeout_s)
    try:
        with Nvml(lib) as nvml:
            report = run_validation(
                nvml,
                node=settings.node_name,
                duration_s=duration_s,
                dcgm=dcgm,
                dcgm_level=dcgm_level,
            )
    except FleetWatchError as exc:
        raise _NoNvml(f"cannot validate: {exc}") from exc
    document = report.model_dump(mode="json")
    document["passed"] = report.passed
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        click.echo(_summary(report))
    if not no_push:
        try:
            _push(settings, report.model_dump_json())
        except _NotPushed:
            if not as_json:
                sys.stdout.write(json.dumps(document) + "\n")  # kept: the result is not lost
            raise
        click.echo(f"pushed to {settings.server_url}", err=True)
    if not report.passed:
        sys.exit(EXIT_FAILED)


def _summary(report: Any) -> str:
    lines = [f"node {report.node}: {'PASSED' if report.passed else 'FAILED'}"]
    counts: dict[str, int] = {}
    for check in report.checks:
        counts[check.status] = counts.get(check.status, 0) + 1
    lines.append("  " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for check in report.checks:
        if check.status in ("fail", "warn"):
            why = f": {check.message}" if check.message else ""
            lines.append(f"  {check.status.upper()} {check.label}{why}")
    absent = sorted({c.name for c in report.checks if c.status == "absent"})
    if absent:
        lines.append(f"  absent (not offered here): {', '.join(absent)}")
    return "\n".join(lines)


def _push(settings: Any, body: str) -> None:
    import httpx

    token = settings.bearer_token()
    if not token:
        raise _NotPushed("no agent token: give --token-file or FLEETWATCH_AGENT_TOKEN")
    refused = settings.plain_http_problem()
    if refused is not None:
        raise _NotPushed(refused)
    url = f"{settings.server_url.rstrip('/')}/v1/nodes/{quote(settings.node_name, safe='')}"
    try:
        verify = settings.client_tls().verify()
    except FleetWatchError as exc:
        raise _NotPushed(str(exc)) from exc
    try:
        response = httpx.post(
            f"{url}/validations",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=settings.push_timeout_s,
            verify=verify,
        )
    except httpx.HTTPError as exc:
        raise _NotPushed(f"could not push the result: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 300:
        raise _NotPushed(
            f"the server refused the result: HTTP {response.status_code}: {response.text[:300]}"
        )
