"""Settings for the server (and, later, the agent), from flags, environment and defaults.

Settings are built only by ``load_server_settings()`` (called from the CLI or ``create_app``);
tests construct them directly. Every knob has a description that ``fleetwatch config show`` prints.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetwatch.errors import ConfigError

__all__ = ["ServerSettings", "load_server_settings"]


class ServerSettings(BaseSettings):
    """The central service. Environment: ``FLEETWATCH_SERVER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="FLEETWATCH_SERVER_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///fleetwatch.db",
        description="SQLAlchemy URL: sqlite:///path.db (embedded) or postgresql://user@host/db",
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on")
    port: int = Field(default=8400, ge=1, le=65535, description="Port to listen on")
    workers: int = Field(default=1, ge=1, le=64, description="Worker processes (uvicorn)")
    insecure_no_auth: bool = Field(
        default=False,
        description="Accept requests without a token, as admin. Local experiments only.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest ingest body, after decompression"
    )
    max_gpus_per_batch: int = Field(default=1024, ge=1, description="Most GPUs in one batch")
    max_samples_per_batch: int = Field(
        default=50_000, ge=1, description="Most samples in one batch"
    )
    max_events_per_batch: int = Field(default=10_000, ge=1, description="Most events in one batch")
    max_future_skew_s: float = Field(
        default=300.0, ge=0, description="How far in the future a timestamp may be (clock skew)"
    )
    unreachable_after_intervals: float = Field(
        default=3.0, gt=1, description="A node is unreachable after this many silent intervals"
    )
    metrics_cache_ttl_s: float = Field(
        default=2.0, ge=0, description="How stale /metrics' cache of latest GPU state may be"
    )
    metrics_require_token: bool = Field(
        default=True, description="/metrics needs a bearer token with read scope"
    )
    db_pool_size: int = Field(default=10, ge=1, description="Connections per worker (PostgreSQL)")

    @field_validator("database_url")
    @classmethod
    def _use_psycopg3(cls, url: str) -> str:
        # SQLAlchemy's bare postgresql:// means psycopg2, which we do not ship.
        for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not url.startswith(("sqlite://", "postgresql+psycopg://")):
            raise ValueError("database_url must start with sqlite:// or postgresql://")
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def load_server_settings(**overrides: Any) -> ServerSettings:
    """Build settings from the environment, with explicit values (e.g. CLI flags) on top."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return ServerSettings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid server settings: {problems}") from exc
