"""Bearer tokens: creation, hashing, lookup and the scope each permission needs.

A token reads ``fwt_<token_id>_<secret>``. The database keeps the token id (to find the row) and
the SHA-256 of the whole token (to check it); the secret is shown once, at creation. Tokens carry
256 bits of randomness, so a fast hash is enough: there is nothing to brute-force.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, func, insert, select, update

from fleetwatch.errors import Forbidden, InvalidInput, NotFound, Unauthenticated
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.tables import api_tokens

__all__ = [
    "SCOPES",
    "SESSION_TTL",
    "Permission",
    "TokenInfo",
    "authenticate",
    "authenticate_session",
    "check_permission",
    "create_token",
    "list_tokens",
    "page_session",
    "revoke_token",
]

SCOPES = ("agent", "read", "scheduler", "admin")


class Permission(enum.Enum):
    INGEST = "ingest"
    READ = "read"
    SCHEDULE = "schedule"
    ADMIN = "admin"
    JOB_NOTICES = "job_notices"  # a training job reads its notices with its agent token


# Which scopes grant each permission. An agent token can only push: a stolen one reads nothing.
GRANTED_BY: dict[Permission, tuple[str, ...]] = {
    Permission.INGEST: ("agent", "admin"),
    Permission.READ: ("read", "scheduler", "admin"),
    Permission.SCHEDULE: ("scheduler", "admin"),
    Permission.ADMIN: ("admin",),
    Permission.JOB_NOTICES: ("agent", "read", "scheduler", "admin"),
}

_PREFIX = "fwt_"
SESSION_TTL = timedelta(hours=12)


@dataclass(frozen=True)
class TokenInfo:
    token_id: str
    name: str
    scope: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    # Agent tokens: the nodes it may speak for, a name or shell pattern (server.node_binding);
    # None: any node (simulators, remote write).
    node_pattern: str | None = None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    conn: Connection, *, name: str, scope: str, node_pattern: str | None = None
) -> tuple[str, TokenInfo]:
    """Store a new token and return it in clear (the only time it exists in clear) with its info.

    ``node_pattern`` binds an agent token to the nodes it names (a name, or a shell pattern such
    as ``gpu-*``): it may then push, validate and report job events for those nodes only.
    """
    if scope not in SCOPES:
        raise InvalidInput(
            f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}",
            [{"loc": ["scope"], "msg": f"must be one of {', '.join(SCOPES)}"}],
        )
    if node_pattern is not None:
        node_pattern = _checked_pattern(node_pattern, scope)
    name = name.strip()
    if not name or len(name) > 128:
        raise InvalidInput(
            "token name must be 1 to 128 characters",
            [{"loc": ["name"], "msg": "1 to 128 characters"}],
        )
    token_id = secrets.token_hex(6)
    token = f"{_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    now = utcnow()
    conn.execute(
        insert(api_tokens).values(
            token_id=token_id,
            name=name,
            scope=scope,
            secret_sha256=_digest(token),
            created_at=now,
            node_pattern=node_pattern,
        )
    )
    info = TokenInfo(
        token_id=token_id, name=name, scope=scope, created_at=now, node_pattern=node_pattern
    )
    return token, info


def _checked_pattern(pattern: str, scope: str) -> str:
    if scope != "agent":
        raise InvalidInput(
            f"only agent tokens are bound to nodes; a {scope} token speaks for no node",
            [{"loc": ["node_pattern"], "msg": "only with scope agent"}],
        )
    pattern = pattern.strip()
    if not pattern or len(pattern) > 253 or not pattern.isprintable() or " " in pattern:
        raise InvalidInput(
            "node pattern must be a node name or a shell pattern (gpu-*, gpu-0[0-3]*), "
            "1 to 253 printable characters without spaces",
            [{"loc": ["node_pattern"], "msg": "1 to 253 printable characters, no spaces"}],
        )
    return pattern


# What an unknown token id is checked against: no token hashes to it (its text is not a token),
# and checking costs what checking a real token's hash costs.
_DUMMY_DIGEST = hashlib.sha256(b"no token hashes to this").hexdigest()


# Built once: building a statement costs more than running it.
_DIGEST_OF = select(func.max(api_tokens.c.secret_sha256)).where(
    api_tokens.c.token_id == bindparam("token_id")
)
_ROW_OF = select(api_tokens).where(api_tokens.c.token_id == bindparam("token_id"))


def _stored_digest(conn: Connection, token_id: str) -> str | None:
    """The token's stored hash, or None. Only the hash, and always one row (an aggregate over no
    rows is one NULL), so that an unknown id and a known one cost the same to look up; the full
    row, with timestamps to parse, is read (:func:`_active_info`) only once the secret is right."""
    found = conn.execute(_DIGEST_OF, {"token_id": token_id}).scalar_one()
    return None if found is None else str(found)


def _matches(presented_hex: str, stored: str | None) -> bool:
    """Constant-time comparison, against a dummy hash when the id is unknown, so that both paths
    do the same work: an unknown token id is not told apart from a wrong secret by timing."""
    same = hmac.compare_digest(presented_hex, stored if stored is not None else _DUMMY_DIGEST)
    return same and stored is not None


def _active_info(conn: Connection, token_id: str) -> TokenInfo:
    row = conn.execute(_ROW_OF, {"token_id": token_id}).first()
    if row is None:  # deleted between the two reads
        raise Unauthenticated("unknown token")
    if row.revoked_at is not None:
        raise Unauthenticated("token revoked")
    return TokenInfo(
        token_id=row.token_id,
        name=row.name,
        scope=row.scope,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        node_pattern=row.node_pattern,
    )


def authenticate(conn: Connection, token: str | None) -> TokenInfo:
    """The active token behind a presented bearer string, or :class:`Unauthenticated`."""
    if not token:
        raise Unauthenticated("missing bearer token: send 'Authorization: Bearer <token>'")
    parts = token.split("_", 2)
    if len(parts) != 3 or f"{parts[0]}_" != _PREFIX:
        raise Unauthenticated("malformed token")
    if not _matches(_digest(token), _stored_digest(conn, parts[1])):
        raise Unauthenticated("unknown token")
    return _active_info(conn, parts[1])


# -- the fleet page's session cookie ----------------------------------------------------------
# ``v1.<token id>.<expiry, unix s>.<mac>``: the MAC is keyed by the token's stored hash, so that a
# session needs no table and no server key, dies with its token (revocation stays immediate: the
# token is looked up on every use), and cannot be made without the token (or the database).
_SESSION_VERSION = "v1"


def _session_mac(digest: str, token_id: str, expires: int) -> str:
    message = f"fleetwatch-page-session:{token_id}:{expires}".encode()
    mac = hmac.new(bytes.fromhex(digest), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def page_session(token: str, token_id: str, *, now: datetime, ttl: timedelta = SESSION_TTL) -> str:
    """A session value for the fleet page's cookie, from a bearer token already checked."""
    expires = int((now + ttl).timestamp())
    return (
        f"{_SESSION_VERSION}.{token_id}.{expires}.{_session_mac(_digest(token), token_id, expires)}"
    )


def authenticate_session(conn: Connection, value: str | None, *, now: datetime) -> TokenInfo:
    """The active token behind a page session value, or :class:`Unauthenticated`."""
    # ASCII only: compare_digest refuses other text, and int() reads other digits ("²").
    parts = (value or "").split(".") if (value or "").isascii() else []
    if len(parts) != 4 or parts[0] != _SESSION_VERSION or not parts[2].isdigit():
        raise Unauthenticated("malformed session")
    _, token_id, expires_text, mac = parts
    expires = int(expires_text)
    stored = _stored_digest(conn, token_id)
    # As for bearer tokens: an unknown id is checked against the dummy hash, at the same cost.
    expected = _session_mac(stored if stored is not None else _DUMMY_DIGEST, token_id, expires)
    if not hmac.compare_digest(mac, expected) or stored is None:
        raise Unauthenticated("unknown session")
    if expires <= now.timestamp():
        raise Unauthenticated("session expired: sign in again")
    return _active_info(conn, token_id)


def check_permission(scope: str, permission: Permission) -> None:
    needed = GRANTED_BY[permission]
    if scope not in needed:
        raise Forbidden(scope, needed)


def touch_token(conn: Connection, token_id: str, when: datetime) -> None:
    conn.execute(
        update(api_tokens).where(api_tokens.c.token_id == token_id).values(last_used_at=when)
    )


def list_tokens(conn: Connection, *, include_revoked: bool = False) -> list[TokenInfo]:
    query = select(api_tokens).order_by(api_tokens.c.id)
    if not include_revoked:
        query = query.where(api_tokens.c.revoked_at.is_(None))
    return [
        TokenInfo(
            token_id=row.token_id,
            name=row.name,
            scope=row.scope,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
            last_used_at=row.last_used_at,
            node_pattern=row.node_pattern,
        )
        for row in conn.execute(query)
    ]


def revoke_token(conn: Connection, key: str) -> TokenInfo:
    """Revoke the active token whose id or name is ``key``; a name shared by several is refused."""
    rows = conn.execute(
        select(api_tokens).where(
            api_tokens.c.revoked_at.is_(None),
            (api_tokens.c.token_id == key) | (api_tokens.c.name == key),
        )
    ).all()
    if not rows:
        raise NotFound("active token", key)
    if len(rows) > 1:
        ids = ", ".join(row.token_id for row in rows)
        raise InvalidInput(
            f"{len(rows)} active tokens are named {key!r} ({ids}); revoke by token id",
            [{"loc": ["token"], "msg": "ambiguous name"}],
        )
    row = rows[0]
    now = utcnow()
    conn.execute(update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=now))
    return TokenInfo(
        token_id=row.token_id,
        name=row.name,
        scope=row.scope,
        created_at=row.created_at,
        revoked_at=now,
        last_used_at=row.last_used_at,
        node_pattern=row.node_pattern,
    )
