"""``fleetwatch config show``: the groups, where each value came from, secrets masked."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fleetwatch.cli import main
from fleetwatch.config import SETTING_GROUPS, AgentSettings, ServerSettings

FERNET_KEY = base64.urlsafe_b64encode(b"k" * 32).decode()


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CliRunner with no FLEETWATCH_* settings from the environment; the CLI's logging set-up
    (it replaces the root handlers) is undone afterwards."""
    for name in list(os.environ):
        if name.upper().startswith(("FLEETWATCH_SERVER_", "FLEETWATCH_AGENT_")):
            monkeypatch.delenv(name)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield CliRunner()
    root.handlers[:], root.level = saved


def _show(runner: CliRunner, *args: str) -> Result:
    result = runner.invoke(main, ["config", "show", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _json(runner: CliRunner, *args: str) -> dict[str, dict[str, object]]:
    settings: dict[str, dict[str, object]] = json.loads(
        _show(runner, "--format", "json", *args).stdout
    )["settings"]
    return settings


def test_config_show_prints_operator_and_fleet_policy_not_advanced(runner: CliRunner) -> None:
    out = _show(runner).stdout
    lines = out.splitlines()
    assert "## operator: what a deployment sets" in lines
    assert "## fleet policy: how the fleet is judged and acted on" in lines
    assert "port = 8400" in lines
    assert "drain_budget_pct = 5.0" in lines
    assert "--all adds the advanced group" in lines[0]
    for advanced in ("gc_gen0_threshold", "malloc_arenas", "ingest_group_linger_ms"):
        assert advanced not in out
    assert not any(line.startswith("## advanced") for line in lines)


def test_config_show_all_adds_the_advanced_group_last(runner: CliRunner) -> None:
    lines = _show(runner, "--all").stdout.splitlines()
    headings = [line.split(":")[0] for line in lines if line.startswith("## ")]
    assert headings == ["## operator", "## fleet policy", "## advanced"]
    assert "gc_gen0_threshold = 50000" in lines
    assert lines.index("gc_gen0_threshold = 50000") > lines.index("drain_budget_pct = 5.0")


def test_config_show_reflects_the_environment_and_says_so(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_SERVER_DRAIN_BUDGET_PCT", "2.5")
    # pydantic-settings matches names case-insensitively; so does the source column.
    monkeypatch.setenv("fleetwatch_server_workers", "3")
    lines = _show(runner).stdout.splitlines()
    budget = lines.index("drain_budget_pct = 2.5")
    assert lines[budget + 1].endswith(
        "[env FLEETWATCH_SERVER_DRAIN_BUDGET_PCT] (set in the environment)"
    )
    port = lines.index("port = 8400")
    assert lines[port + 1].endswith("[env FLEETWATCH_SERVER_PORT]")
    shown = _json(runner)
    assert shown["drain_budget_pct"]["value"] == 2.5
    assert shown["drain_budget_pct"]["source"] == "environment"
    assert shown["workers"] == {
        "group": "operator",
        "value": 3,
        "source": "environment",
        "env": "FLEETWATCH_SERVER_WORKERS",
        "description": ServerSettings.model_fields["workers"].description,
    }
    assert shown["port"]["source"] == "default"


def test_config_show_masks_keys_and_passwords(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_SERVER_SECRET_KEYS", FERNET_KEY)
    monkeypatch.setenv(
        "FLEETWATCH_SERVER_DATABASE_URL", "postgresql://fw:s3cret@db.example/fw?password=s3cret"
    )
    for args in ((), ("--all",), ("--format", "json"), ("--all", "--format", "json")):
        out = _show(runner, *args).stdout
        assert FERNET_KEY not in out and FERNET_KEY[:12] not in out, args
        assert "s3cret" not in out, args
    lines = _show(runner).stdout.splitlines()
    assert "secret_keys = ['**********']" in lines
    assert "database_url = 'postgresql+psycopg://fw:***@db.example/fw?password=***'" in lines


def test_config_show_json_parses_with_every_setting_of_the_groups(runner: CliRunner) -> None:
    document = json.loads(_show(runner, "--format", "json").stdout)
    assert document["kind"] == "server"
    assert document["env_prefix"] == "FLEETWATCH_SERVER_"
    groups = {entry["group"] for entry in document["settings"].values()}
    assert groups == {"operator", "fleet policy"}
    everything = _json(runner, "--all")
    order = [SETTING_GROUPS.index(entry["group"]) for entry in everything.values()]
    assert order == sorted(order)
    assert set(everything) == set(ServerSettings.model_fields)


def test_config_show_agent_masks_the_token_and_reads_its_file(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEETWATCH_AGENT_TOKEN", "fwt_agent_s3cret")
    config_file = tmp_path / "agent.toml"
    config_file.write_text('server_url = "https://fw.example:8400"\npush_timeout_s = 5.0\n')
    out = _show(runner, "--agent", "--config", str(config_file), "--all").stdout
    assert "fwt_agent_s3cret" not in out
    assert out.splitlines()[0].startswith("# agent settings (environment FLEETWATCH_AGENT_<NAME>")
    shown = _json(runner, "--agent", "--config", str(config_file), "--all")
    assert set(shown) == set(AgentSettings.model_fields)
    assert shown["token"]["value"] == "**********"
    assert shown["token"]["source"] == "environment"
    assert shown["server_url"] == {
        **shown["server_url"],
        "value": "https://fw.example:8400",
        "source": "file",
    }
    assert shown["push_timeout_s"]["group"] == "advanced"
    assert shown["interval_s"]["source"] == "default"
    without_all = _json(runner, "--agent")
    assert "push_timeout_s" not in without_all and "server_url" in without_all


@pytest.mark.parametrize(
    ("variable", "value", "args"),
    [
        ("FLEETWATCH_SERVER_PORT", "99999", ()),
        ("FLEETWATCH_SERVER_RISK_HORIZONS_H", "24,168", ()),
        ("FLEETWATCH_SERVER_SECRET_KEYS", "not-a-key", ("--format", "json")),
        ("FLEETWATCH_AGENT_COLLECTORS", "nvml,bogus", ("--agent",)),
    ],
)
def test_config_show_bad_environment_value_names_the_variable(
    runner: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    args: tuple[str, ...],
) -> None:
    monkeypatch.setenv(variable, value)
    result = runner.invoke(main, ["config", "show", *args])
    assert result.exit_code == 2, result.output
    assert variable in result.stderr
    assert result.stderr.startswith("Error: invalid ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_config_show_config_file_needs_agent(runner: CliRunner, tmp_path: Path) -> None:
    config_file = tmp_path / "agent.toml"
    config_file.write_text("")
    result = runner.invoke(main, ["config", "show", "--config", str(config_file)])
    assert result.exit_code == 2
    assert "--agent" in result.stderr
