"""The container image's health check: `python -m fleetwatch.healthcheck` asks this machine's
server for ``/healthz`` and exits 0 when it answers 200.

Over HTTPS when the server serves TLS (``FLEETWATCH_SERVER_TLS_CERT`` set), without checking
the certificate: the probe talks to the process beside it on the loopback address, which the
certificate's names need not include. A server that requires client certificates
(``FLEETWATCH_SERVER_TLS_CLIENT_CA``) refuses the probe's handshake: probe it from outside with
a TCP check instead, as the Helm chart does.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request

__all__ = ["main", "probe_url"]


def probe_url(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    scheme = "https" if environ.get("FLEETWATCH_SERVER_TLS_CERT") else "http"
    return f"{scheme}://127.0.0.1:{environ.get('FLEETWATCH_SERVER_PORT', '8400')}/healthz"


def main() -> int:
    url = probe_url()
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as answer:
            return 0 if answer.status == 200 else 1
    except OSError as error:
        sys.stderr.write(f"healthcheck: {url}: {error}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
