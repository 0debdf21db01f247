"""FleetWatch's exception tree. Every error the product raises on purpose is one of these.

::

    FleetWatchError
      ConfigError                 bad settings or flags; the CLI exits 2
      StorageError                the database refused or is unreachable
        NotFound                  a named node, GPU, token, ... does not exist
        SchemaOutOfDate           the database is not migrated to this version's head
        StorageFull               the database's disk is full: nothing was stored (507)
      Conflict                    a state change the resource's current state forbids (409)
      InvalidInput                input that fails validation (loc + msg per problem)
        PayloadTooLarge           a request body over the configured limit
        BatchConflict             a batch_id replayed with different content
        GpuClaimed                a GPU uuid another node reports right now (409; also a Conflict)
        UnsupportedMediaType      a Content-Type or Content-Encoding the server does not read
      AuthError
        Unauthenticated           no token, or an unknown/revoked one
        Forbidden                 a valid token without the scope an endpoint needs
        NodeForbidden             a caller speaking for a node its token or certificate is not for
      PushError                   the agent could not deliver a batch (wraps httpx errors)
      SourceError                 an outside source (Prometheus' HTTP API) unreachable or refusing
      CollectorError              a telemetry source failed
        NvmlUnavailable           no NVML library or driver on this node
        DeviceLost                a GPU stopped answering (fallen off the bus, reset)
        FieldNotSupported         this GPU or driver does not offer a reading
      ModelError                  a statistical model cannot be fitted or used

Routes raise these; ``server/errors.py`` maps each to one HTTP status in one table, and ``cli.py``
maps each to one exit code. Context travels as attributes, not only in the message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AuthError",
    "BatchConflict",
    "CollectorError",
    "ConfigError",
    "Conflict",
    "DeviceLost",
    "FieldNotSupported",
    "FleetWatchError",
    "Forbidden",
    "GpuClaimed",
    "InvalidInput",
    "ModelError",
    "NodeForbidden",
    "NotFound",
    "NvmlUnavailable",
    "PayloadTooLarge",
    "PushError",
    "SchemaOutOfDate",
    "SourceError",
    "StorageError",
    "StorageFull",
    "Unauthenticated",
    "UnsupportedMediaType",
]


class FleetWatchError(Exception):
    """Base of every error FleetWatch raises on purpose."""

    exit_code = 1


class ConfigError(FleetWatchError):
    exit_code = 2


class StorageError(FleetWatchError):
    pass


class NotFound(StorageError):
    def __init__(self, what: str, key: str) -> None:
        super().__init__(f"{what} {key!r} not found")
        self.what = what
        self.key = key


class SchemaOutOfDate(StorageError):
    def __init__(self, current: str | None, head: str) -> None:
        super().__init__(
            f"database schema is at revision {current or 'none'}, this version needs {head}; "
            "run `fleetwatch db upgrade`"
        )
        self.current = current
        self.head = head


class StorageFull(StorageError):
    """A write failed because the database's disk is full; the transaction was rolled back."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the server's storage is full, nothing was stored ({reason}); "
            "retry later, an operator must free disk space"
        )
        self.reason = reason


class Conflict(FleetWatchError):
    """A state change that the resource's current state (``state``) does not allow."""

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


class InvalidInput(FleetWatchError):
    """Input that fails validation; ``detail`` has one ``{"loc": [...], "msg": ...}`` a problem."""

    def __init__(self, message: str, detail: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.detail = list(detail)


class MalformedBody(InvalidInput):
    """A body that cannot be decoded at all (answered 400: no field of it can be named)."""


class PayloadTooLarge(InvalidInput):
    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            f"request body exceeds the limit of {limit_bytes} bytes; send smaller batches",
            [{"loc": ["body"], "msg": f"more than {limit_bytes} bytes"}],
        )
        self.limit_bytes = limit_bytes


class BatchConflict(InvalidInput):
    def __init__(self, batch_id: str) -> None:
        super().__init__(
            f"batch_id {batch_id!r} was already stored with different content; "
            "a batch_id must be unique per batch",
            [{"loc": ["body", "batch_id"], "msg": "reused for a different batch"}],
        )
        self.batch_id = batch_id


class UnsupportedMediaType(InvalidInput):
    pass


class GpuClaimed(InvalidInput, Conflict):
    """A batch declares GPUs that other nodes report right now (cloned UUIDs, a wrong agent).

    A :class:`Conflict` (409) that, as invalid input, names each field in ``detail``; ``claims``
    holds ``(uuid, reporting node, owning node)`` for each, so the server can record them.
    """

    def __init__(
        self, message: str, detail: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str, str]]
    ) -> None:
        super().__init__(message, detail)
        self.state = None
        self.claims = tuple(claims)


class AuthError(FleetWatchError):
    pass


class Unauthenticated(AuthError):
    pass


class Forbidden(AuthError):
    def __init__(self, scope: str, needed: Sequence[str]) -> None:
        super().__init__(
            f"token scope {scope!r} may not do this; it needs one of: {', '.join(needed)}"
        )
        self.scope = scope
        self.needed = tuple(needed)


class NodeForbidden(AuthError):
    """A batch, validation or job event for ``node`` from a caller that may not speak for it:
    its token is bound to other nodes, or its client certificate names another node."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"may not speak for node {node!r}: {reason}")
        self.node = node
        self.reason = reason


class PushError(FleetWatchError):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class SourceError(FleetWatchError):
    """A source history is read from (``fleetwatch import prometheus``) cannot be reached or
    refused a query; ``url`` is what was asked."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class CollectorError(FleetWatchError):
    pass


class NvmlUnavailable(CollectorError):
    pass


class DeviceLost(CollectorError):
    def __init__(self, message: str, gpu_uuid: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.gpu_uuid = gpu_uuid
        self.index = index


class FieldNotSupported(CollectorError):
    def __init__(self, field: str, message: str = "") -> None:
        super().__init__(message or f"{field} is not supported by this GPU or driver")
        self.field = field


class ModelError(FleetWatchError):
    pass
