"""Risk-model versions: store one per refit, list them, load the one in service.

A version's status is ``ok`` (fitted and promoted: the newest ``ok`` one serves), ``rejected``
(fitted, but it scored worse than the version in service on the held-out window:
:mod:`fleetwatch.server.upkeep.promotion`) or ``failed`` (not fitted).
"""

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
    "serving_version",
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
    evaluation: dict[str, Any] | None = None,
    promoted: bool = True,
) -> int:
    """Store a version and return its number: with a bundle ``ok`` (``promoted``) or
    ``rejected``, else ``failed`` with ``error``. ``metrics`` (e.g. the training size of a failed
    fit) defaults to the bundle's; ``evaluation`` is the held-out comparison, as JSON."""
    fitted = bundle is not None and error is None
    status = ("ok" if promoted else "rejected") if fitted else "failed"
    result = conn.execute(
        insert(risk_models).values(
            trained_at=trained_at,
            trigger=trigger,
            status=status,
            params=bundle.to_params() if fitted and bundle is not None else None,
            metrics=metrics if metrics is not None else (bundle.metrics if bundle else None),
            error=None if fitted else (error or "no model was fitted"),
            evaluation=evaluation,
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
    risk_models.c.evaluation,
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


def serving_version(conn: Connection) -> int | None:
    """The number of the version in service (what :func:`latest_ok_model` loads), if any."""
    query = (
        select(risk_models.c.version)
        .where(risk_models.c.status == "ok")
        .order_by(risk_models.c.version.desc())
        .limit(1)
    )
    return conn.execute(query).scalar()


def latest_ok_model(conn: Connection) -> StoredModel | None:
    """The version in service: the newest one fitted and promoted (``ok``; a ``rejected`` refit
    never serves), or None when there is none yet."""
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
