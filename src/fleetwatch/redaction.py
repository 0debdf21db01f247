"""Credentials masked out of text bound for a log: every FleetWatch process's formatters apply it
(:mod:`fleetwatch.log_format`) to each line they write.

A log is read by more people, kept longer and copied further than any credential should be. The
fleet page's documented link ``/?token=fwt_...`` put read (and admin) tokens into uvicorn's access
log, so the rules go by what a credential looks like, not by who logged it:

- FleetWatch's own tokens, ``fwt_<id>_<secret>``, wherever they appear (a path, a message);
- query parameters whose name says credential (``token``, ``access_token``, ``api_key``,
  ``password``, ``client_secret``, ``X-Amz-Signature``, ...), in any URL;
- the value of an ``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie``,
  ``X-Api-Key`` or ``X-Auth-Token`` header, written as ``Name: value`` or as ASGI's
  ``(b'name', b'value')``, and any ``Bearer <credential>``.

Masking a harmless value costs a log reader a little; leaking a credential costs a token
rotation, so a name that merely looks secret is masked too.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact"]

MASK = "[REDACTED]"

# Its id and secret are URL-safe base64; "%5F" is "_" in a percent-encoded address.
_FLEETWATCH_TOKEN = re.compile(r"fwt(?:_|%5[fF])[A-Za-z0-9_%-]+")
_QUERY_PARAMETER = re.compile(r"(?P<lead>[?&;](?P<name>[^=&?;#\s\"']+)=)(?P<value>[^&;#\s\"']*)")
_BEARER = re.compile(r"(?i)\b(?P<lead>bearer\s+)[A-Za-z0-9._~+/=-]+")
_HEADER = re.compile(
    r"(?i)(?P<lead>\b(?:proxy-authorization|authorization|set-cookie|cookie|x-api-key|x-auth-token)"
    # "Name: value", "name=value", or a quoted name before a comma: ASGI's (b'name', b'value')
    r"(?:['\"]?\s*[:=]\s*(?:b?['\"])?|['\"]\s*,\s*b?['\"]))(?P<value>[^'\"\r\n]+)"
)
# A parameter is a credential when one word of its name is one of these ...
_SECRET_WORDS = frozenset(
    "token secret password passwd pwd auth authorization credential credentials session "
    "sessionid signature sig cookie jwt bearer apikey".split()
)
# ... or its name, separators dropped, holds one of these (access_token, apikey, AWSSecretKey).
_SECRET_PARTS = ("token", "secret", "passw", "credential", "apikey", "accesskey", "privatekey")


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    words = re.split(r"[^a-z0-9]+", lowered)
    joined = "".join(words)
    return any(word in _SECRET_WORDS for word in words) or any(p in joined for p in _SECRET_PARTS)


def _mask_parameter(match: re.Match[str]) -> str:
    if _secret_name(match["name"]):
        return match["lead"] + MASK
    return match[0]


def redact(text: str) -> str:
    """``text`` with every credential the rules above recognise replaced by :data:`MASK`."""
    if not text:
        return text
    text = _HEADER.sub(lambda m: m["lead"] + MASK, text)
    text = _BEARER.sub(lambda m: m["lead"] + MASK, text)
    text = _QUERY_PARAMETER.sub(_mask_parameter, text)
    return _FLEETWATCH_TOKEN.sub("fwt_" + MASK, text)
