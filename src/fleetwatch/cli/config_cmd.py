"""``fleetwatch config show``: every setting, its value, where to set it, and what it does."""

from __future__ import annotations

import re

import click

from fleetwatch.config import ServerSettings, load_server_settings

__all__ = ["config"]


def _mask(url: str) -> str:
    return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1***@", url)


@click.group()
def config() -> None:
    """Configuration."""


@config.command("show")
def config_show() -> None:
    """Print the effective server settings (environment and defaults)."""
    settings = load_server_settings()
    click.echo(
        f"# server settings (environment prefix {ServerSettings.model_config['env_prefix']})"
    )
    for name, field in ServerSettings.model_fields.items():
        value = getattr(settings, name)
        shown = _mask(value) if name == "database_url" else value
        env = f"FLEETWATCH_SERVER_{name.upper()}"
        click.echo(f"{name} = {shown!r}\n    {field.description}  [env {env}]")
