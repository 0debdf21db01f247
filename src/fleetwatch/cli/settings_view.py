"""Settings as ``fleetwatch config show`` prints them: one row per field, secrets masked.

A row says where its value came from: ``environment`` when its ``FLEETWATCH_*`` variable is set
(matched case-insensitively, as pydantic-settings does), ``file`` when the agent's TOML file set
it, else ``default``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_settings import BaseSettings

from fleetwatch.config import SETTING_GROUPS, SettingGroup, env_var, setting_group

__all__ = ["GROUP_TITLES", "SettingRow", "mask", "setting_rows"]

Source = Literal["default", "environment", "file"]

GROUP_TITLES: dict[SettingGroup, str] = {
    "operator": "what a deployment sets",
    "fleet policy": "how the fleet is judged and acted on",
    "advanced": "internal tuning; the defaults suit most fleets",
}

# A password in a URL's user part, or in a query parameter (libpq takes ?password=).
_URL_PASSWORD = re.compile(r"(://[^:/@]+:)[^@]+@")
_QUERY_SECRET = re.compile(r"([?&](?:password|token|secret)[^=&]*=)[^&]*", re.IGNORECASE)


@dataclass(frozen=True)
class SettingRow:
    name: str
    group: SettingGroup
    env: str
    value: Any  # JSON-ready: secrets already masked
    source: Source
    description: str


def mask(value: Any) -> Any:
    """``value`` with passwords in URLs replaced by ``***``, lists and mappings included."""
    if isinstance(value, str):
        return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", value))
    if isinstance(value, list):
        return [mask(item) for item in value]
    if isinstance(value, dict):
        return {key: mask(item) for key, item in value.items()}
    return value


def setting_rows(
    settings: BaseSettings, *, groups: Collection[SettingGroup] = SETTING_GROUPS
) -> list[SettingRow]:
    """The fields of ``groups``, group by group in ``SETTING_GROUPS`` order, each group in
    declaration order."""
    model = type(settings)
    # JSON mode prints every SecretStr (secret_keys, the agent's token) as asterisks.
    values = settings.model_dump(mode="json")
    in_environment = {name.upper() for name in os.environ}
    rows = []
    for group in SETTING_GROUPS:
        if group not in groups:
            continue
        for name, field in model.model_fields.items():
            if setting_group(model, name) != group:
                continue
            env = env_var(model, name)
            source: Source = "default"
            if env in in_environment:
                source = "environment"
            elif name in settings.model_fields_set:
                source = "file"
            rows.append(
                SettingRow(
                    name=name,
                    group=group,
                    env=env,
                    value=mask(values[name]),
                    source=source,
                    description=field.description or "",
                )
            )
    return rows
