"""Risk-model versions: store one per refit (fitted or failed), list them, load the newest."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, Row, insert, select

from fleetwatch.errors import NotFound
from fleetwatch.server.db.tables import risk_models

if TYPE_CHECKING:
    from fleetwatch.models.registry import RiskBundle

__all__ = [
    "StoredModel",
    "get_model",
    "latest_ok_model",
    "list_models",
    "ok_model",
    "store_model",
]

Trigger = Literal["schedule", "manual", "startup"]


@dataclass(frozen=True)
class StoredModel:
    """A fitted version with what it needs to score."""

    version: int
    trained_at: datetime
    trigger: str
    params: dict[str, Any]
    metrics: dict[str, Any]

    def bundle(self) -> RiskBundle:
        from fleetwatch.models.registry import RiskBundle

        return RiskBundle.from_params(self.params)


def store_model(
    conn: Connection,
    bundle: RiskBundle | None,
    *,
    trigger: Trigger,
    trained_at: datetime,
    error: str | None = None,
    metrics: dict[str, Any] | None = None,
) -> int:
    """Store a version and return its number: ``ok`` with a bundle, else ``failed`` with
    ``error``. ``metrics`` (e.g. the training size of a failed fit) defaults to the bundle's."""
    ok = bundle is not None and error is None
    result = conn.execute(
        insert(risk_models).values(
            trained_at=trained_at,
            trigger=trigger,
            status="ok" if ok else "failed",
            params=bundle.to_params() if ok and bundle is not None else None,
            metrics=metrics if metrics is not None else (bundle.metrics if bundle else None),
            error=None if ok else (error or "no model was fitted"),
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


# What a version's listing shows: everything but the fitted parameters.
_LISTED = [
    risk_models.c.version,
    risk_models.c.trained_at,
    risk_models.c.trigger,
    risk_models.c.status,
    risk_models.c.metrics,
    risk_models.c.error,
]


def list_models(conn: Connection, limit: int = 100) -> list[Row[Any]]:
    """Versions, newest first."""
    query = select(*_LISTED).order_by(risk_models.c.version.desc()).limit(limit)
    return list(conn.execute(query))


def get_model(conn: Connection, version: int) -> Row[Any]:
    """One version; :class:`NotFound` naming it if absent."""
    row = conn.execute(select(*_LISTED).where(risk_models.c.version == version)).first()
    if row is None:
        raise NotFound("model version", str(version))
    return row


def latest_ok_model(conn: Connection) -> StoredModel | None:
    """The newest successfully fitted version, or None when there is none yet."""
    query = (
        select(risk_models)
        .where(risk_models.c.status == "ok")
        .order_by(risk_models.c.version.desc())
        .limit(1)
    )
    return _stored(conn.execute(query).first())


def ok_model(conn: Connection, version: int) -> StoredModel | None:
    """Fitted version ``version``, or None when it is not there (or failed)."""
    query = select(risk_models).where(
        (risk_models.c.version == version) & (risk_models.c.status == "ok")
    )
    return _stored(conn.execute(query).first())


def _stored(row: Row[Any] | None) -> StoredModel | None:
    if row is None:
        return None
    return StoredModel(
        version=row.version,
        trained_at=row.trained_at,
        trigger=row.trigger,
        params=row.params,
        metrics=row.metrics or {},
    )
