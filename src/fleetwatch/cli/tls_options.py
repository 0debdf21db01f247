"""``--ca-bundle``, ``--client-cert`` and ``--client-key``: the same three options on every command
that calls the server (see :mod:`fleetwatch.client_tls`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fleetwatch.client_tls import CA_BUNDLE_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV

__all__ = ["client_tls_options"]

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def client_tls_options(*, shared_env: bool = True, **option: Any) -> Callable[[F], F]:
    """The three options as ``ca_bundle``, ``client_cert`` and ``client_key`` parameters.

    ``shared_env``: each falls back to its ``FLEETWATCH_*`` variable here. The agent's commands
    say False: their settings read ``FLEETWATCH_AGENT_*`` first and the shared variables after.
    ``option``: more of ``click.option``'s arguments for all three (e.g. a callback).
    """
    specs = (
        ("--ca-bundle", CA_BUNDLE_ENV, "CA bundle the server's certificate must chain to"),
        ("--client-cert", CLIENT_CERT_ENV, "Client certificate (PEM) for mutual TLS"),
        ("--client-key", CLIENT_KEY_ENV, "Its private key, unless the certificate's file holds it"),
    )

    def decorate(func: F) -> F:
        for flag, env, text in reversed(specs):
            own = env.replace("FLEETWATCH_", "FLEETWATCH_AGENT_", 1)
            where = env if shared_env else f"{own}, else {env}"
            func = click.option(
                flag,
                type=_FILE,
                envvar=env if shared_env else None,
                help=f"{text} [env {where}]",
                **option,
            )(func)
        return func

    return decorate
