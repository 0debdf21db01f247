"""The FleetWatch scheduler API as the adapters see it: evictions to carry out, and returns.

The contract (bearer token with scope ``scheduler``)::

    GET  /v1/evictions?state=pending&limit=N   -> {"count": n, "data": [eviction, ...],
                                                   "cursor": c}
    GET  /v1/evictions?state=pending&wait=S    -> the same, held up to S s until one matches
    GET  /v1/evictions?state=pending&state=returned&changed_after=C&wait=S
                                               -> those changed after cursor C, held up to S s
    POST /v1/evictions/{id}/ack      {"lease_s": 300}  -> 200 eviction | 409 held by another
    POST /v1/evictions/{id}/complete                   -> 200 eviction
    POST /v1/evictions/{id}/reject   {"reason": ...}   -> 200 eviction
    POST /v1/nodes/{name}/return     {"note": ...}     -> 200 | 404 no completed eviction
                                                      | 409 not validated (hardware eviction)
    GET  /v1/maintenance?state=upcoming&state=active&key_prefix=P -> {"count": n, "data": [...]}
    POST /v1/maintenance {"nodes": [...], "reason": ..., "key": ...} -> 201 window
    DELETE /v1/maintenance/{id}                        -> 200 window (ended now)

Errors: ``SchedulerApiError`` (a ``FleetWatchError``, exit code 4) for anything the server or the
network refuses; ``EvictionConflict`` for a 409 on ack (someone else holds the lease).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict

from fleetwatch.client_tls import ClientTls
from fleetwatch.errors import FleetWatchError

if TYPE_CHECKING:
    from fleetwatch.adapters.maintenance import MaintenancePlan

__all__ = [
    "Eviction",
    "EvictionConflict",
    "EvictionList",
    "MaintenanceWindow",
    "ReturnRefused",
    "SchedulerApiError",
    "SchedulerClient",
]

logger = logging.getLogger(__name__)


class SchedulerApiError(FleetWatchError):
    """The FleetWatch server (or the network to it) refused a scheduler API call."""

    exit_code = 4

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class EvictionConflict(SchedulerApiError):
    """409: another scheduler adapter holds this eviction's lease."""


class ReturnRefused(SchedulerApiError):
    """409 on a return: the node was evicted for a hardware reason and has no passing
    validation newer than the eviction (the message names what failed)."""


class Eviction(BaseModel):
    """One eviction as the server publishes it; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    id: int
    node: str
    state: str
    reason_kind: str = "rule"
    reason: str = ""
    evidence: dict[str, Any] | None = None
    expected_saving_usd: float | None = None
    dry_run: bool = False
    claimed_by: str | None = None


class MaintenanceWindow(BaseModel):
    """One maintenance window as the server publishes it; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    id: int
    state: str
    nodes: list[str] | None = None
    starts_at: datetime
    ends_at: datetime | None = None
    reason: str
    key: str | None = None


@dataclass(frozen=True)
class EvictionList:
    evictions: list[Eviction]
    cursor: int | None  # the server's change cursor; None from a server older than cursors


class SchedulerClient:
    """Calls the scheduler API through the given ``httpx.Client`` (its base_url is the server)."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http

    @classmethod
    def connect(
        cls, server_url: str, token: str, timeout_s: float = 10.0, *, tls: ClientTls | None = None
    ) -> SchedulerClient:
        """A client of ``server_url``; ``tls``: the CA bundle and client certificate (default:
        httpx's public roots, no client certificate)."""
        http = httpx.Client(
            base_url=server_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=(tls or ClientTls()).verify(),
        )
        return cls(http)

    def close(self) -> None:
        self._http.close()

    def list_evictions(self, state: str, limit: int = 500) -> list[Eviction]:
        return self.read_evictions((state,), limit).evictions

    def wait_for_evictions(self, state: str, wait_s: float, limit: int = 500) -> list[Eviction]:
        """The long-poll: answered as soon as an eviction in ``state`` exists, else after
        ``wait_s`` (0 to 60) with an empty list. A server older than the long-poll ignores
        ``wait`` and answers at once; the caller must not treat that as news."""
        return self.read_evictions((state,), limit, wait_s=wait_s).evictions

    def read_evictions(
        self,
        states: Sequence[str],
        limit: int = 500,
        *,
        changed_after: int | None = None,
        wait_s: float = 0.0,
    ) -> EvictionList:
        """Evictions in any of ``states``; with ``changed_after``, only those changed since that
        cursor; with ``wait_s``, held until one matches (a long-poll, 0 to 60 s)."""
        params: dict[str, Any] = {"state": list(states), "limit": limit}
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if changed_after is not None:
            params["changed_after"] = changed_after
        if wait_s > 0:
            params["wait"] = f"{wait_s:g}"
            configured = self._http.timeout
            # The server holds the answer up to wait_s: the read timeout must outlast it.
            read_s = (configured.read if configured.read is not None else 10.0) + wait_s
            timeout = httpx.Timeout(
                configured.connect, read=read_s, write=configured.write, pool=configured.pool
            )
        body = self._call("GET", "/v1/evictions", params=params, timeout=timeout)
        cursor = body.get("cursor")
        return EvictionList(
            [Eviction.model_validate(item) for item in body.get("data", [])],
            cursor if isinstance(cursor, int) else None,
        )

    def ack(self, eviction_id: int, lease_s: int = 300) -> Eviction:
        """Claim an eviction; raises ``EvictionConflict`` if another adapter holds it."""
        body = self._call("POST", f"/v1/evictions/{eviction_id}/ack", json={"lease_s": lease_s})
        return Eviction.model_validate(body)

    def complete(self, eviction_id: int) -> Eviction:
        return Eviction.model_validate(self._call("POST", f"/v1/evictions/{eviction_id}/complete"))

    def reject(self, eviction_id: int, reason: str) -> Eviction:
        body = self._call("POST", f"/v1/evictions/{eviction_id}/reject", json={"reason": reason})
        return Eviction.model_validate(body)

    def return_node(self, node: str, note: str) -> bool:
        """Tell FleetWatch the node is back in service; False if it had no completed eviction.
        Raises ``ReturnRefused`` when the server's return gate refuses (no passing validation)."""
        try:
            self._call("POST", f"/v1/nodes/{quote(node, safe='')}/return", json={"note": note})
        except SchedulerApiError as exc:
            if exc.status_code == 404:
                return False
            if exc.status_code == 409:
                raise ReturnRefused(str(exc), 409) from exc
            raise
        return True

    def list_maintenance(self, key_prefix: str) -> list[MaintenanceWindow]:
        """Windows not yet ended (upcoming or active) whose key starts with ``key_prefix``."""
        params = {"state": ["upcoming", "active"], "key_prefix": key_prefix, "limit": 10_000}
        body = self._call("GET", "/v1/maintenance", params=params)
        return [MaintenanceWindow.model_validate(item) for item in body.get("data", [])]

    def open_maintenance(self, plan: MaintenancePlan, *, key: str) -> MaintenanceWindow:
        body: dict[str, Any] = {"nodes": list(plan.nodes), "reason": plan.reason, "key": key}
        if plan.starts_at is not None:
            body["starts_at"] = plan.starts_at.isoformat()
        if plan.ends_at is not None:
            body["ends_at"] = plan.ends_at.isoformat()
        return MaintenanceWindow.model_validate(self._call("POST", "/v1/maintenance", json=body))

    def end_maintenance(self, window_id: int) -> MaintenanceWindow:
        answer = self._call("DELETE", f"/v1/maintenance/{window_id}")
        return MaintenanceWindow.model_validate(answer)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SchedulerApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            message = f"{method} {path}: HTTP {response.status_code}: {_detail(response)}"
            error = EvictionConflict if response.status_code == 409 else SchedulerApiError
            raise error(message, response.status_code)
        try:
            body = response.json()
        except ValueError as exc:
            raise SchedulerApiError(f"{method} {path}: the answer is not JSON") from exc
        if not isinstance(body, dict):
            raise SchedulerApiError(f"{method} {path}: expected a JSON object")
        return body


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if key in body:
                return str(body[key])[:200]
    return str(body)[:200]
