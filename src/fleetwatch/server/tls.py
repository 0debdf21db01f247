"""The server's TLS: its certificate, key and client CA, re-read when they change.

uvicorn builds the listening ``SSLContext`` once per process, through the factory it is given
(``ssl_context_factory``): :class:`ServerTls`, a picklable description of the files, so that each
worker process (``--workers``) builds its own. The context asks for TLS 1.2 or newer and, with a
client CA, requires a client certificate that chains to it (mutual TLS).

Renewal without a restart: cert-manager (and kubelet's secret volumes, by a symlink swap)
replace the files in place. The listening context's SNI callback runs early in every handshake,
before the server's certificate is chosen; at most once every ``reload_check_s`` it compares the
files' identity (device, inode, size, modification time, through symlinks) with what was loaded,
and on a change loads the new set into a fresh context and switches the handshake to it, and
every later one. A set that fails to load (a key that does not match its certificate: files
caught mid-rotation) leaves the previous one serving, with one WARNING per changed set; the next
check tries again. Connections already open keep the certificate they began with.

The callback runs on the event loop's thread, like every handshake of the process: nothing here
needs a lock.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetwatch.config import ServerSettings
from fleetwatch.errors import ConfigError

__all__ = ["CertificateReloader", "ServerTls", "server_tls"]

logger = logging.getLogger(__name__)

_Signature = tuple[tuple[int, int, int, int] | None, ...]


@dataclass(frozen=True)
class ServerTls:
    """The files of the server's TLS, and uvicorn's ``ssl_context_factory``."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    reload_check_s: float = 5.0

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca else ())

    def build(self) -> ssl.SSLContext:
        """A context from the files as they are now; ``ssl.SSLError`` or ``OSError`` when they
        do not load."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def check(self) -> None:
        """:class:`ConfigError` naming the files when they do not load (before the server
        starts)."""
        try:
            self.build()
        except (OSError, ssl.SSLError) as exc:
            names = ", ".join(str(path) for path in self.files)
            raise ConfigError(f"cannot load the TLS files ({names}): {exc}") from exc

    def __call__(self, config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """uvicorn's ``ssl_context_factory``: the listening context of one server process."""
        return CertificateReloader(self).listening


def server_tls(settings: ServerSettings) -> ServerTls | None:
    """The TLS files ``settings`` name, or None to serve plain HTTP."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return ServerTls(
        cert=settings.tls_cert,
        key=settings.tls_key,
        client_ca=settings.tls_client_ca,
        reload_check_s=settings.tls_reload_check_s,
    )


class CertificateReloader:
    """The listening context, whose handshakes pick up changed files (module docstring).

    ``clock``: monotonic seconds (tests drive it)."""

    def __init__(self, tls: ServerTls, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.tls = tls
        self._clock = clock
        self._loaded = self._signature()  # before reading: a change meanwhile is seen next time
        self.listening = tls.build()
        self.listening.sni_callback = self._on_hello
        self.current = self.listening
        self._next_check = clock() + tls.reload_check_s
        self._warned: _Signature | None = None
        self.reloads = 0

    def _signature(self) -> _Signature:
        found: list[tuple[int, int, int, int] | None] = []
        for path in self.tls.files:
            try:
                st = os.stat(path)  # through symlinks: a swapped link is a changed file
            except OSError:
                found.append(None)
                continue
            found.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(found)

    def refresh(self) -> ssl.SSLContext:
        """The context new handshakes get: the current one, after loading the files anew when
        the check is due and they changed."""
        now = self._clock()
        if now < self._next_check:
            return self.current
        self._next_check = now + self.tls.reload_check_s
        seen = self._signature()
        if seen == self._loaded:
            return self.current
        try:
            fresh = self.tls.build()
        except (OSError, ssl.SSLError) as exc:
            if seen != self._warned:
                self._warned = seen
                logger.warning(
                    "TLS files changed but do not load, still serving the previous certificate "
                    "(%s): %s",
                    ", ".join(str(path) for path in self.tls.files),
                    exc,
                )
            return self.current
        self._loaded = seen
        self.current = fresh
        self.reloads += 1
        logger.info("TLS certificate reloaded from %s", self.tls.cert)
        return fresh

    def _on_hello(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: Any
    ) -> None:
        # An exception here would fail the handshake with an internal error: refresh() catches
        # what loading files raises.
        context = self.refresh()
        if context is not ssl_object.context:
            ssl_object.context = context
