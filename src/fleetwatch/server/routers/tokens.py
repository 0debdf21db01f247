"""API tokens, for admins: the same operations as `fleetwatch token`."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fleetwatch.server.auth import create_token, list_tokens, revoke_token
from fleetwatch.server.deps import AdminAuth, DatabaseDep, TokenCacheDep
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text

__all__ = ["router"]

router = APIRouter(prefix="/tokens", tags=["tokens"])


class TokenCreate(BaseModel):
    name: Text = Field(min_length=1, max_length=128, examples=["pool-a"])
    scope: Literal["agent", "read", "scheduler", "admin"]
    node_pattern: Text | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Agent tokens only: the nodes it may speak for, a name or shell pattern "
        "(gpu-*); unset, any node",
        examples=["gpu-*"],
    )


class TokenPublic(BaseModel):
    token_id: str
    name: str
    scope: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    node_pattern: str | None = Field(
        default=None, description="Agent tokens: the nodes it may speak for; null, any node"
    )


class TokenCreated(TokenPublic):
    token: str = Field(description="The bearer token; shown this once, stored only hashed")


@router.post("", response_model=TokenCreated, status_code=201, summary="Create a token")
def post_token(body: TokenCreate, db: DatabaseDep, _token: AdminAuth) -> TokenCreated:
    """Create a token; the response is the only place its secret appears."""
    with db.write() as conn:
        secret, info = create_token(
            conn, name=body.name, scope=body.scope, node_pattern=body.node_pattern
        )
    return TokenCreated(token=secret, **info.__dict__)


@router.get("", response_model=list[TokenPublic], summary="List tokens (never their secrets)")
def get_tokens(
    db: DatabaseDep, _token: AdminAuth, include_revoked: bool = False
) -> list[TokenPublic]:
    """Active tokens, or all of them with include_revoked=true."""
    with db.read() as conn:
        return [
            TokenPublic(**t.__dict__) for t in list_tokens(conn, include_revoked=include_revoked)
        ]


@router.delete(
    "/{key}",
    response_model=TokenPublic,
    responses=error_responses(404),
    summary="Revoke a token by id or name",
)
def delete_token(
    key: Text, db: DatabaseDep, cache: TokenCacheDep, _token: AdminAuth
) -> TokenPublic:
    """Revoke: the next request with it to this server process answers 401; other processes
    (replicas) refuse it within their token_cache_ttl_s (default 5 s)."""
    with db.write() as conn:
        revoked = revoke_token(conn, key)
    cache.forget(revoked.token_id)
    return TokenPublic(**revoked.__dict__)
