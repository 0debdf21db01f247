"""Request dependencies: the database, settings and the caller's token, as Annotated aliases."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetwatch.config import ServerSettings
from fleetwatch.errors import StorageFull, Unauthenticated
from fleetwatch.server.auth import (
    Permission,
    TokenInfo,
    authenticate,
    check_permission,
    touch_token,
)
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.token_cache import TokenCache

__all__ = [
    "AdminAuth",
    "DatabaseDep",
    "IngestAuth",
    "NoticeAuth",
    "LivenessDep",
    "ReadAuth",
    "SchedulerAuth",
    "SettingsDep",
    "TokenCacheDep",
    "check_credentials",
    "require",
]

logger = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="A token from `fleetwatch token create`")
_TOUCH_EVERY_S = 60.0
_touched: dict[str, float] = {}
_touched_lock = threading.Lock()


# Plain attribute reads: async, so FastAPI does not send each through a threadpool hop
# (a quarter of a millisecond apiece, measured in benchmarks/ingest.py).
async def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_settings(request: Request) -> ServerSettings:
    settings: ServerSettings = request.app.state.settings
    return settings


async def get_liveness(request: Request) -> Liveness:
    liveness: Liveness = request.app.state.liveness
    return liveness


async def get_token_cache(request: Request) -> TokenCache:
    cache: TokenCache = request.app.state.token_cache
    return cache


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
# This process's one rule for node state, shared with the planner and the alerter.
LivenessDep = Annotated[Liveness, Depends(get_liveness)]
TokenCacheDep = Annotated[TokenCache, Depends(get_token_cache)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]

_NO_AUTH = TokenInfo(token_id="-", name="insecure-no-auth", scope="admin", created_at=utcnow())


def _use_due(token_id: str) -> bool:
    """Whether this token's last_used_at is due a write: once a minute per token keeps writes
    (audits, not accounting) off the hot path."""
    now = time.monotonic()
    with _touched_lock:
        if now - _touched.get(token_id, -_TOUCH_EVERY_S) < _TOUCH_EVERY_S:
            return False
        _touched[token_id] = now
    return True


def _record_use(db: Database, token_id: str) -> None:
    try:
        with db.write() as conn:
            touch_token(conn, token_id, utcnow())
    except StorageFull:
        # Reads keep working on a full disk; only this audit timestamp is lost.
        logger.debug("last_used_at of token %s not recorded: storage full", token_id)


def _presented(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    presented = credentials.credentials if credentials else None
    if presented is not None and "\x00" in presented:
        # No token holds one, and PostgreSQL cannot even look it up (the page's ?token= and
        # sign-in form reach here too): refused as malformed before any query.
        raise Unauthenticated("malformed token")
    return presented


def _check_token(db: Database, presented: str | None) -> TokenInfo:
    with db.read() as conn:
        return authenticate(conn, presented)


def check_credentials(
    db: Database,
    settings: ServerSettings,
    credentials: HTTPAuthorizationCredentials | None,
    permission: Permission,
) -> TokenInfo:
    """The caller's token, checked in the database every time (no cache): for the fleet page's
    sign-in, which runs in the threadpool already and is rare."""
    if settings.insecure_no_auth:
        return _NO_AUTH
    info = _check_token(db, _presented(credentials))
    check_permission(info.scope, permission)
    if _use_due(info.token_id):
        _record_use(db, info.token_id)
    return info


def require(permission: Permission) -> Callable[..., Awaitable[TokenInfo]]:
    """A dependency giving the caller's token when its scope grants ``permission``.

    async: a token the cache remembers (server.token_cache) costs no query and no threadpool
    hop (about 250 us each, measured in benchmarks/ingest.py); only a database check takes one.
    """

    async def dependency(
        db: DatabaseDep, settings: SettingsDep, cache: TokenCacheDep, credentials: Credentials
    ) -> TokenInfo:
        if settings.insecure_no_auth:
            return _NO_AUTH
        presented = _presented(credentials)
        info = cache.get(presented) if presented else None
        if info is None and presented:
            check = functools.partial(_check_token, db, presented)
            info = await run_in_threadpool(cache.remember, presented, check)
        elif info is None:
            info = await run_in_threadpool(_check_token, db, None)  # raises: no token
        check_permission(info.scope, permission)
        if _use_due(info.token_id):
            await run_in_threadpool(_record_use, db, info.token_id)
        return info

    return dependency


IngestAuth = Annotated[TokenInfo, Depends(require(Permission.INGEST))]
ReadAuth = Annotated[TokenInfo, Depends(require(Permission.READ))]
SchedulerAuth = Annotated[TokenInfo, Depends(require(Permission.SCHEDULE))]
AdminAuth = Annotated[TokenInfo, Depends(require(Permission.ADMIN))]
# The StepReporter's agent token reads its job's notices; so do read tokens.
NoticeAuth = Annotated[TokenInfo, Depends(require(Permission.JOB_NOTICES))]
