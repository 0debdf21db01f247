"""The server's API from a CLI command: the ``--server`` option and one authenticated call.

Shared by the commands that manage server state over HTTP (``fleetwatch webhook``,
``fleetwatch maintenance``), with the client TLS options each of them takes; a refusal becomes a
``ClickException`` naming the status, the server's message and, for a 422, each field and its
reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fleetwatch.cli.tls_options import client_tls_options
from fleetwatch.client_tls import ClientTls

__all__ = ["SERVER_OPTION", "call_api", "token_option"]

F = TypeVar("F", bound=Callable[..., Any])

_SERVER_URL = click.option(
    "--server",
    "server_url",
    envvar="FLEETWATCH_URL",
    default="http://127.0.0.1:8400",
    show_default=True,
    help="FleetWatch server URL [env FLEETWATCH_URL]",
)
_TLS_KEY = "fleetwatch.client_tls"


def _keep_tls(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    """The TLS options go to :func:`call_api` through the context, not to every command."""
    ctx.meta.setdefault(_TLS_KEY, {})[str(param.name)] = value


def SERVER_OPTION(func: F) -> F:
    """``--server`` (env ``FLEETWATCH_URL``) and the client TLS options (``--ca-bundle``,
    ``--client-cert``, ``--client-key``; see :mod:`fleetwatch.client_tls`)."""
    func = client_tls_options(expose_value=False, callback=_keep_tls)(func)
    return _SERVER_URL(func)


def token_option(help_text: str) -> Callable[[F], F]:
    """``--token`` (env ``FLEETWATCH_TOKEN``), required; ``help_text`` names the scope."""
    return click.option("--token", envvar="FLEETWATCH_TOKEN", required=True, help=help_text)


def call_api(server_url: str, token: str, method: str, path: str, **kwargs: Any) -> Any:
    """``method path`` with the bearer ``token``; the JSON answer, or a clear CLI error."""
    import httpx

    from fleetwatch.errors import FleetWatchError

    context = click.get_current_context(silent=True)
    options = context.meta.get(_TLS_KEY, {}) if context is not None else {}
    verify = ClientTls.from_env(**options).verify()
    try:
        response = httpx.request(
            method,
            server_url.rstrip("/") + path,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=verify,
            **kwargs,
        )
    except httpx.HTTPError as exc:
        raise FleetWatchError(f"cannot reach {server_url}: {exc}") from exc
    if not response.is_success:
        try:
            body = response.json()
            message = str(body.get("error", response.text))
            where = [f"{'.'.join(map(str, d['loc'][1:]))}: {d['msg']}" for d in body["detail"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            message, where = response.text, []
        detail = f" ({'; '.join(where)})" if where else ""
        raise click.ClickException(f"HTTP {response.status_code}: {message}{detail}")
    return response.json()
