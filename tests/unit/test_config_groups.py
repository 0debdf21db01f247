"""Every setting belongs to exactly one group, named in the field's own metadata."""

from __future__ import annotations

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings

from fleetwatch.config import (
    SETTING_GROUPS,
    AgentSettings,
    ServerSettings,
    setting_group,
)


@pytest.mark.parametrize("settings", [ServerSettings, AgentSettings])
def test_config_every_setting_names_a_known_group(settings: type[BaseSettings]) -> None:
    missing = []
    for name in settings.model_fields:
        try:
            assert setting_group(settings, name) in SETTING_GROUPS
        except ValueError as exc:
            missing.append(str(exc))
    assert not missing, (
        "give each setting json_schema_extra=OPERATOR, FLEET_POLICY or ADVANCED: "
        + "; ".join(missing)
    )


def test_config_setting_group_refuses_a_field_without_one() -> None:
    class Loose(BaseSettings):
        plain: int = Field(default=1, description="no group")
        odd: int = Field(default=1, description="unknown", json_schema_extra={"group": "misc"})

    with pytest.raises(ValueError, match=r"Loose\.plain names no setting group"):
        setting_group(Loose, "plain")
    with pytest.raises(ValueError, match=r"Loose\.odd names no setting group \('misc'\)"):
        setting_group(Loose, "odd")


def test_config_server_operator_group_stays_short() -> None:
    # The operator group is what a newcomer reads first; the issue that made the groups counted
    # 14 settings an operator needs out of 82. Issue 37 added the three TLS files (17).
    operator = [
        n for n in ServerSettings.model_fields if setting_group(ServerSettings, n) == "operator"
    ]
    assert 10 <= len(operator) <= 18, operator
    for needed in ("database_url", "host", "port", "workers", "role", "secret_keys"):
        assert needed in operator


def test_config_tuning_knobs_are_advanced() -> None:
    for name in ("gc_gen0_threshold", "malloc_arenas", "ingest_group_linger_ms", "db_pool_size"):
        assert setting_group(ServerSettings, name) == "advanced", name
    for name in ("drain_budget_pct", "unreachable_after_intervals", "webhook_max_attempts"):
        assert setting_group(ServerSettings, name) == "fleet policy", name
