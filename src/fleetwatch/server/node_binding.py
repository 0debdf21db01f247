"""A node speaks only for itself: who may push a batch, a validation or a job event for a node.

Two checks, each applying when it can:

- the **token**: an agent token bound to a node name or shell pattern (``fleetwatch token create
  --scope agent --node 'gpu-*'``) speaks for the nodes it matches, case-sensitively
  (:func:`fnmatch.fnmatchcase`); an unbound token (simulators, remote write) for any node;
- the **client certificate**, under mutual TLS (``tls_client_ca``): the node must be one of the
  certificate's names (subject CN or a DNS SAN, compared without case), whatever the token.

A refusal is :class:`~fleetwatch.errors.NodeForbidden` (403), naming the node and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from fleetwatch.errors import NodeForbidden
from fleetwatch.server.auth import TokenInfo
from fleetwatch.server.client_certs import client_cert_names

__all__ = ["check_speaks_for"]


def check_speaks_for(scope: Mapping[str, Any], token: TokenInfo, nodes: Iterable[str]) -> None:
    """Raise :class:`NodeForbidden` for the first of ``nodes`` this caller may not speak for.

    ``scope``: the request's ASGI scope, where the connection's client certificate is.
    """
    pattern = token.node_pattern
    cert_names = client_cert_names(scope)
    if pattern is None and cert_names is None:
        return
    for node in nodes:
        if pattern is not None and not fnmatchcase(node, pattern):
            raise NodeForbidden(
                node, f"token {token.name!r} is bound to nodes matching {pattern!r}"
            )
        if cert_names is not None and node.lower() not in cert_names:
            names = ", ".join(sorted(cert_names)) or "no name"
            raise NodeForbidden(node, f"the client certificate names {names}")
