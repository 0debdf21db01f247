"""``fleetwatch server`` hands its settings to the app (and its worker processes) through the
environment: every setting reads back as it was, lists included. A comma-splitting reader once
turned the JSON list ["Hostname", "instance"] into two labels no series carries, and every
remote-write series was refused as having no node."""

from __future__ import annotations

import pytest

from fleetwatch.cli.server_cmds import settings_environment
from fleetwatch.config import ServerSettings


def test_every_setting_reads_back_from_the_environment_it_is_handed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen = ServerSettings(  # type: ignore[call-arg]
        remote_write_node_labels=["kubernetes_node", "node", "instance"],
        remote_write_settle_s=3.5,
        _env_file=None,
    )
    for key, text in settings_environment(chosen).items():
        if text is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, text)
    again = ServerSettings(_env_file=None)  # type: ignore[call-arg]
    exported = chosen.model_dump(exclude={"secret_keys"})
    assert again.model_dump(exclude={"secret_keys"}) == exported
    assert again.remote_write_node_labels == ["kubernetes_node", "node", "instance"]
