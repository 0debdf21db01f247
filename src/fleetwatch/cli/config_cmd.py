"""``fleetwatch config``: the settings in effect, and the configuration reference page.

``config show`` prints the operator and fleet policy groups of the server's settings, read from
the environment as ``fleetwatch server`` reads them (``--all`` adds the advanced group,
``--agent`` shows the agent's). Secrets never appear: keys and tokens print as asterisks,
passwords in URLs as ``***``. A bad value exits 2 naming its environment variable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import click

from fleetwatch.cli.config_docs import render_configuration_reference
from fleetwatch.cli.settings_view import GROUP_TITLES, SettingRow, setting_rows
from fleetwatch.config import (
    SETTING_GROUPS,
    AgentSettings,
    ServerSettings,
    SettingGroup,
    load_agent_settings,
    load_server_settings,
)

__all__ = ["config"]


@click.group()
def config() -> None:
    """Settings: what is in effect, and the reference page."""


@config.command("show")
@click.option("--all", "show_all", is_flag=True, help="Add the advanced (internal tuning) group.")
@click.option("--agent", is_flag=True, help="The agent's settings instead of the server's.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --agent: the agent's TOML file, as `fleetwatch agent --config` reads it.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
)
def config_show(show_all: bool, agent: bool, config_file: Path | None, output_format: str) -> None:
    """Print the settings in effect (environment and defaults), grouped, secrets masked."""
    if config_file is not None and not agent:
        raise click.UsageError("--config is the agent's file: use it with --agent")
    model: type[ServerSettings | AgentSettings]
    if agent:
        settings: ServerSettings | AgentSettings = load_agent_settings(config_file)
        model, kind = AgentSettings, "agent"
    else:
        settings = load_server_settings()
        model, kind = ServerSettings, "server"
    groups: tuple[SettingGroup, ...] = SETTING_GROUPS if show_all else ("operator", "fleet policy")
    rows = setting_rows(settings, groups=groups)
    prefix = model.model_config.get("env_prefix", "")
    if output_format == "json":
        click.echo(json.dumps(_as_json(kind, prefix, rows), indent=2))
        return
    hidden = "" if show_all else "; --all adds the advanced group"
    click.echo(f"# {kind} settings (environment {prefix}<NAME>{hidden})")
    for line in _as_text(rows):
        click.echo(line)


@config.command("docs")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (docs/configuration.md) instead of printing.",
)
def config_docs(output: Path | None) -> None:
    """Write the configuration reference (docs/configuration.md) from the settings' fields."""
    page = render_configuration_reference()
    if output is None:
        click.echo(page, nl=False)
    else:
        output.write_text(page, encoding="utf-8")


def _as_text(rows: Iterable[SettingRow]) -> Iterable[str]:
    group = None
    for row in rows:
        if row.group != group:
            group = row.group
            yield f"\n## {group}: {GROUP_TITLES[group]}\n"
        # Defaults go unmarked, so that what this deployment changed stands out.
        source = "" if row.source == "default" else f" (set in the {row.source})"
        yield f"{row.name} = {row.value!r}"
        yield f"    {row.description}  [env {row.env}]{source}"


def _as_json(kind: str, prefix: str, rows: Iterable[SettingRow]) -> dict[str, object]:
    return {
        "kind": kind,
        "env_prefix": prefix,
        "settings": {
            row.name: {
                "group": row.group,
                "value": row.value,
                "source": row.source,
                "env": row.env,
                "description": row.description,
            }
            for row in rows
        },
    }
