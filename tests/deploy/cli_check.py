"""What deployment files hand FleetWatch, checked against FleetWatch itself: a command line
parsed by its own CLI without running it, and environment names that are its settings. A typo in
either passes every schema (the chart's, systemd's) but fails here."""

from __future__ import annotations

from pathlib import Path

import click

from fleetwatch.adapters.settings import AdapterSettings
from fleetwatch.cli import main as fleetwatch_cli
from fleetwatch.client_tls import CA_BUNDLE_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV
from fleetwatch.config import AgentSettings, ServerSettings

__all__ = ["is_setting", "parse_args"]

_SETTINGS = {
    "FLEETWATCH_SERVER_": set(ServerSettings.model_fields),
    "FLEETWATCH_AGENT_": set(AgentSettings.model_fields),
    "FLEETWATCH_SCHEDULER_": set(AdapterSettings.model_fields),
}
# Read by every client (fleetwatch.client_tls), outside the settings classes.
_CLIENT_TLS_ENV = {CA_BUNDLE_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV}


def is_setting(name: str) -> bool:
    """Whether FleetWatch reads the environment variable ``name``."""
    if name in _CLIENT_TLS_ENV:
        return True
    prefix = next((p for p in _SETTINGS if name.startswith(p)), None)
    return prefix is not None and name.removeprefix(prefix).lower() in _SETTINGS[prefix]


def _rest(ctx: click.Context) -> list[str]:
    """The tokens a group left for its subcommand (click 8.2 keeps the subcommand's name apart,
    in a deprecated attribute; click 9 puts everything in ``args``)."""
    return [*getattr(ctx, "_protected_args", []), *ctx.args]


def _existing(arg: str) -> str:
    """``--flag=/mounted/file`` with a file that exists here in place of the pod's or host's
    file (the CLI checks that the CA, certificate and key files exist when it parses them)."""
    flag, sep, value = arg.partition("=")
    if sep and value.startswith("/etc/fleetwatch/") and not Path(value).exists():
        return f"{flag}={__file__}"
    return arg


def parse_args(args: list[str]) -> click.Context:
    """Parse ``fleetwatch ARGS`` as the CLI would, without running it: a command or flag it
    does not have fails here."""
    ctx = fleetwatch_cli.make_context("fleetwatch", [_existing(a) for a in args])
    name, *rest = _rest(ctx)
    command = fleetwatch_cli.get_command(ctx, name)
    assert command is not None, name
    sub = command.make_context(name, rest, parent=ctx)
    if isinstance(command, click.Group):
        leaf_name, *leaf_rest = _rest(sub)
        leaf = command.get_command(sub, leaf_name)
        assert leaf is not None, leaf_name
        return leaf.make_context(leaf_name, leaf_rest, parent=sub)
    return sub
