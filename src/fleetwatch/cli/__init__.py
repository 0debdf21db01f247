"""``fleetwatch``: one entry point, one subcommand per part of the product.

Errors print as one line and a non-zero exit code; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from fleetwatch import __version__
from fleetwatch.cli.logs import configure_logging
from fleetwatch.errors import FleetWatchError

__all__ = ["main"]

logger = logging.getLogger(__name__)


class MissingExtra(click.ClickException):
    exit_code = 3


class _DomainError(click.ClickException):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click reads it per instance too


class _Group(click.Group):
    """Turns every error into one clear line; the traceback only with --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except FleetWatchError as exc:
            if ctx.meta.get("fleetwatch.debug"):
                raise
            raise _DomainError(str(exc), exc.exit_code) from exc
        except ModuleNotFoundError as exc:
            if ctx.meta.get("fleetwatch.debug"):
                raise
            raise MissingExtra(
                f"{exc.name} is not installed; install the extra this command needs, e.g. "
                "pip install 'fleetwatch[server]' (or [agent], [models])"
            ) from exc
        except BrokenPipeError:
            # `fleetwatch ... | head` closed the pipe: not an error worth a message.
            sys.stderr.close()
            raise click.exceptions.Exit(0) from None
        except Exception as exc:
            if ctx.meta.get("fleetwatch.debug"):
                raise
            raise click.ClickException(_one_line(exc)) from exc


def _one_line(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if type(exc).__module__.startswith("sqlalchemy"):
        return f"database error: {first}"
    return f"{type(exc).__name__}: {first} (run with --debug for the traceback)"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetwatch")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.pass_context
def main(ctx: click.Context, debug: bool, log_level: str, log_format: str) -> None:
    """FleetWatch: GPU fleet health monitoring and failure prediction."""
    ctx.meta["fleetwatch.debug"] = debug
    configure_logging("debug" if debug else log_level, log_format)


def _register() -> None:
    from fleetwatch.cli import (
        adapters_cmd,
        agent_cmd,
        config_cmd,
        dashboards_cmd,
        demo_cmd,
        import_cmd,
        inventory_cmd,
        maintenance_cmd,
        model_cmd,
        parse_cmd,
        prometheus_cmd,
        report_cmd,
        secrets_cmd,
        server_cmds,
        sim_cmd,
        validate_cmd,
        webhooks_cmd,
    )

    main.add_command(server_cmds.server)
    main.add_command(server_cmds.db)
    main.add_command(server_cmds.token)
    main.add_command(config_cmd.config)
    main.add_command(demo_cmd.demo)
    main.add_command(agent_cmd.agent)
    main.add_command(validate_cmd.validate)
    main.add_command(parse_cmd.parse)
    main.add_command(sim_cmd.sim)
    main.add_command(model_cmd.model)
    main.add_command(inventory_cmd.inventory)
    main.add_command(import_cmd.import_group)
    main.add_command(adapters_cmd.slurm_sync)
    main.add_command(adapters_cmd.k8s_sync)
    main.add_command(dashboards_cmd.dashboards)
    main.add_command(webhooks_cmd.webhook)
    main.add_command(maintenance_cmd.maintenance)
    main.add_command(report_cmd.report)
    main.add_command(secrets_cmd.secrets)
    main.add_command(prometheus_cmd.prometheus)


_register()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
