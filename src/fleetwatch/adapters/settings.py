"""Settings of the scheduler adapters (``slurm-sync``, ``k8s-sync``): flags, else environment
``FLEETWATCH_SCHEDULER_<NAME>``, else defaults. Prefer the environment for the token: a flag is
visible to every user of the node in ``ps``."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetwatch.errors import ConfigError

__all__ = ["AdapterSettings", "load_adapter_settings"]


class AdapterSettings(BaseSettings):
    """A scheduler adapter. Environment: ``FLEETWATCH_SCHEDULER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="FLEETWATCH_SCHEDULER_", extra="ignore")

    server_url: str = Field(description="FleetWatch server, e.g. https://fleetwatch:8400")
    token: SecretStr = Field(description="Bearer token with scope 'scheduler'")
    interval_s: float = Field(default=5.0, ge=0.1, le=3600, description="Seconds between passes")
    lease_s: int = Field(
        default=300, ge=1, le=86400, description="How long an acked eviction stays claimed"
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Timeout of one API call")

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url


_FLAGS = {"server_url": "--server", "token": "--token", "interval_s": "--interval"}


def load_adapter_settings(**flags: Any) -> AdapterSettings:
    """Flags that are not None override the environment; errors become one ``ConfigError``."""
    given = {key: value for key, value in flags.items() if value is not None}
    try:
        return AdapterSettings(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else "settings"
            where = f"{_FLAGS.get(name, name)} / FLEETWATCH_SCHEDULER_{name.upper()}"
            problems.append(f"{where}: {error['msg']}")
        raise ConfigError("; ".join(problems)) from None
