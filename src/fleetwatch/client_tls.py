"""How every FleetWatch client checks the server and proves itself: one set of TLS options.

The agent, ``fleetwatch validate``, the CLI's API calls (``webhook``, ``maintenance``),
``slurm-sync``, ``k8s-sync`` and the training job's ``StepReporter`` all take

- ``--ca-bundle FILE``: the CA bundle the server's certificate must chain to (default: the
  public roots httpx trusts, or ``SSL_CERT_FILE``);
- ``--client-cert FILE`` and ``--client-key FILE``: a client certificate for a server that
  requires one (mutual TLS); the key may sit in the certificate's file;

and read one environment variable each when the option is not given: ``FLEETWATCH_CA_BUNDLE``,
``FLEETWATCH_CLIENT_CERT``, ``FLEETWATCH_CLIENT_KEY`` (the agent also reads its own
``FLEETWATCH_AGENT_*`` settings first). Only the standard library is imported here, so the
agent-only install and a training job can use it; httpx is imported where a context is built.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleetwatch.errors import ConfigError

__all__ = [
    "CA_BUNDLE_ENV",
    "CLIENT_CERT_ENV",
    "CLIENT_KEY_ENV",
    "ClientTls",
    "is_loopback_url",
]

CA_BUNDLE_ENV = "FLEETWATCH_CA_BUNDLE"
CLIENT_CERT_ENV = "FLEETWATCH_CLIENT_CERT"
CLIENT_KEY_ENV = "FLEETWATCH_CLIENT_KEY"


@dataclass(frozen=True)
class ClientTls:
    """The TLS options of one client; all None: httpx's defaults (verify against public roots)."""

    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    @classmethod
    def from_env(
        cls,
        ca_bundle: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
    ) -> ClientTls:
        """The given options, each falling back to its ``FLEETWATCH_*`` environment variable."""
        return cls(
            ca_bundle=_path(ca_bundle, CA_BUNDLE_ENV),
            client_cert=_path(client_cert, CLIENT_CERT_ENV),
            client_key=_path(client_key, CLIENT_KEY_ENV),
        )

    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify=``: True when nothing is set, else a context with the CA bundle and
        the client certificate loaded. A file that cannot be read is a :class:`ConfigError`
        naming it, raised here rather than at the first request."""
        if self.client_key is not None and self.client_cert is None:
            raise ConfigError("--client-key needs --client-cert (FLEETWATCH_CLIENT_CERT)")
        if self.ca_bundle is None and self.client_cert is None:
            return True
        try:
            if self.ca_bundle is not None:
                context = ssl.create_default_context(cafile=str(self.ca_bundle))
            else:
                import httpx

                context = httpx.create_ssl_context()  # the roots httpx trusts by default
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot read the CA bundle {self.ca_bundle}: {exc}") from exc
        if self.client_cert is not None:
            key = str(self.client_key) if self.client_key is not None else None
            try:
                context.load_cert_chain(str(self.client_cert), key)
            except (OSError, ssl.SSLError) as exc:
                files = f"{self.client_cert}" + (f" / {self.client_key}" if key else "")
                raise ConfigError(f"cannot load the client certificate {files}: {exc}") from exc
        return context


def _path(given: str | os.PathLike[str] | None, env: str) -> Path | None:
    if given is not None and str(given):
        return Path(given)
    found = os.environ.get(env, "").strip()
    return Path(found) if found else None


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine: ``localhost``, 127.0.0.0/8 or ::1 (never looked
    up: a name other than localhost may resolve anywhere)."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
