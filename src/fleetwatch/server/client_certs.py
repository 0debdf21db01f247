"""What a TLS connection knows about its client, handed to the app in the ASGI scope.

uvicorn puts nothing of TLS in the scope. The server's HTTP protocol
(:mod:`fleetwatch.server.http_protocol`) calls :func:`tls_extension` once per connection, after
the handshake, and each request's scope carries the result as ``scope["extensions"]["tls"]``:
the keys of the ASGI TLS extension that Python's ``ssl`` can fill (``tls_version``,
``client_cert_chain``: the client's own certificate only, ``client_cert_name``), plus
``fleetwatch_cert_names``: the client certificate's subject common names and DNS subject
alternative names, lowercased, which :func:`client_cert_names` reads back.

A client certificate is there only when the server required one (``tls_client_ca``) and it was
verified: Python's ``ssl`` gives no parsed certificate otherwise.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

__all__ = ["CERT_NAMES_KEY", "client_cert_names", "tls_extension"]

CERT_NAMES_KEY = "fleetwatch_cert_names"
_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}
# RFC 4514's short names for the attributes Python's ssl spells out.
_SHORT = {
    "commonName": "CN",
    "countryName": "C",
    "domainComponent": "DC",
    "localityName": "L",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "userId": "UID",
}


def tls_extension(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> dict[str, Any]:
    """The ``tls`` scope extension of one handshaken connection."""
    extension: dict[str, Any] = {
        "server_cert": None,
        "client_cert_chain": [],
        "client_cert_name": None,
        "client_cert_error": None,
        "tls_version": _TLS_VERSIONS.get(ssl_object.version() or ""),
        "cipher_suite": None,
        CERT_NAMES_KEY: None,
    }
    peer = ssl_object.getpeercert()
    if not peer:  # none asked for, or not verified
        return extension
    subject = [pair for rdn in _tuples(peer.get("subject")) for pair in _pairs(rdn)]
    common_names = [value for key, value in subject if key == "commonName"]
    dns_names = [v for kind, v in _pairs(peer.get("subjectAltName")) if kind == "DNS"]
    der = ssl_object.getpeercert(binary_form=True)
    if der:
        extension["client_cert_chain"] = [ssl.DER_cert_to_PEM_cert(der)]
    extension["client_cert_name"] = ",".join(
        f"{_SHORT.get(key, key)}={_escaped(value)}" for key, value in reversed(subject)
    )
    extension[CERT_NAMES_KEY] = frozenset(name.lower() for name in [*common_names, *dns_names])
    return extension


def _tuples(value: object) -> tuple[object, ...]:
    return value if isinstance(value, tuple) else ()


def _pairs(value: object) -> list[tuple[str, str]]:
    """``((key, value), ...)`` as ``getpeercert()`` nests them, anything else left out."""
    return [
        (str(pair[0]), str(pair[1]))
        for pair in _tuples(value)
        if isinstance(pair, tuple) and len(pair) == 2
    ]


def _escaped(value: str) -> str:
    """An attribute value as RFC 4514 writes it: its special characters after a backslash."""
    value = value.replace("\\", "\\\\")
    for char in ',+"<>;=':
        value = value.replace(char, "\\" + char)
    if value.startswith(("#", " ")):
        value = "\\" + value
    return value[:-1] + "\\ " if value.endswith(" ") else value


def client_cert_names(scope: Mapping[str, Any]) -> frozenset[str] | None:
    """The verified client certificate's names (lowercase), or None without one."""
    tls = scope.get("extensions", {}).get("tls")
    if not tls:
        return None
    names = tls.get(CERT_NAMES_KEY)
    return names if isinstance(names, frozenset) else None
