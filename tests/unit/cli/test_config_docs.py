"""docs/configuration.md is generated from the settings and must not go stale."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fleetwatch.cli import main
from fleetwatch.cli.config_docs import REGENERATE, render_configuration_reference
from fleetwatch.config import AgentSettings, ServerSettings, env_var

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_config_docs_committed_page_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == render_configuration_reference(), (
        f"docs/configuration.md is stale: regenerate it with `{REGENERATE}` "
        "(from the repository root, in the project's virtual environment) and commit it"
    )


def test_config_docs_lists_every_setting_with_its_variable_and_description() -> None:
    page = render_configuration_reference()
    for settings in (ServerSettings, AgentSettings):
        for name, field in settings.model_fields.items():
            row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
            assert f"`{env_var(settings, name)}`" in row
            assert (field.description or "").replace("<", "\\<") in row
    assert "| `node_name` | `FLEETWATCH_AGENT_NODE_NAME` | the hostname |" in page
    assert "| `port` | `FLEETWATCH_SERVER_PORT` | `8400` | integer, ≥ 1, ≤ 65535 |" in page


def test_config_docs_command_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    result = CliRunner().invoke(main, ["config", "docs", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == render_configuration_reference()
