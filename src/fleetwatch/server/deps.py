"""Request dependencies: the database, settings and the caller's token, as Annotated aliases."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
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
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.liveness import Liveness

__all__ = [
    "AdminAuth",
    "DatabaseDep",
    "IngestAuth",
    "LivenessDep",
    "ReadAuth",
    "SchedulerAuth",
    "SettingsDep",
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


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
# This process's one rule for node state, shared with the planner and the alerter.
LivenessDep = Annotated[Liveness, Depends(get_liveness)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]

_NO_AUTH = TokenInfo(token_id="-", name="insecure-no-auth", scope="admin", created_at=utcnow())


def _record_use(db: Database, token_id: str) -> None:
    # last_used_at is for audits, not accounting: once a minute per token keeps writes off the
    # hot path.
    now = time.monotonic()
    with _touched_lock:
        if now - _touched.get(token_id, -_TOUCH_EVERY_S) < _TOUCH_EVERY_S:
            return
        _touched[token_id] = now
    try:
        with db.write() as conn:
            touch_token(conn, token_id, utcnow())
    except StorageFull:
        # Reads keep working on a full disk; only this audit timestamp is lost.
        logger.debug("last_used_at of token %s not recorded: storage full", token_id)


def require(permission: Permission) -> Callable[..., TokenInfo]:
    def dependency(db: DatabaseDep, settings: SettingsDep, credentials: Credentials) -> TokenInfo:
        if settings.insecure_no_auth:
            return _NO_AUTH
        presented = credentials.credentials if credentials else None
        if presented is not None and "\x00" in presented:
            # No token holds one, and PostgreSQL cannot even look it up (the page's ?token= and
            # sign-in form reach here too): refused as malformed before any query.
            raise Unauthenticated("malformed token")
        with db.read() as conn:
            info = authenticate(conn, presented)
        check_permission(info.scope, permission)
        _record_use(db, info.token_id)
        return info

    return dependency


IngestAuth = Annotated[TokenInfo, Depends(require(Permission.INGEST))]
ReadAuth = Annotated[TokenInfo, Depends(require(Permission.READ))]
SchedulerAuth = Annotated[TokenInfo, Depends(require(Permission.SCHEDULE))]
AdminAuth = Annotated[TokenInfo, Depends(require(Permission.ADMIN))]
