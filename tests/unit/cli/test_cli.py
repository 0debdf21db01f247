"""The ``fleetwatch`` command line: tokens, schema, settings, and how errors look."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import make_batch

from fleetwatch.cli import main
from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.db.migrate import head_revision

# Nothing listens on port 1; the connection is refused at once.
UNREACHABLE_PG = "postgresql://fleetwatch@127.0.0.1:1/fleetwatch?connect_timeout=3"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CliRunner with no FLEETWATCH_* settings from the environment; the CLI's logging set-up
    (it replaces the root handlers) is undone afterwards."""
    for name in list(os.environ):
        if name.startswith("FLEETWATCH_SERVER_"):
            monkeypatch.delenv(name)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("alembic").level)
    yield CliRunner()
    root.handlers[:], root.level = saved[0], saved[1]
    logging.getLogger("alembic").setLevel(saved[2])


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _run(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(main, list(args), catch_exceptions=False)


def _create(runner: CliRunner, db_url: str, name: str, scope: str = "read") -> str:
    result = _run(
        runner, "token", "create", "--scope", scope, "--name", name, "--database-url", db_url
    )
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[-1]


def test_cli_token_create_prints_a_working_token_alone_on_the_last_line(
    runner: CliRunner, db_url: str
) -> None:
    token = _create(runner, db_url, "pool-a", "read")
    assert token.startswith("fwt_") and " " not in token
    with TestClient(create_app(ServerSettings(database_url=db_url))) as client:
        assert client.get("/v1/nodes", headers=bearer(token)).status_code == 200
        assert client.get("/v1/tokens", headers=bearer(token)).status_code == 403
        assert client.get("/v1/nodes", headers=bearer(token + "x")).status_code == 401


def test_cli_token_create_refuses_unknown_scope(runner: CliRunner, db_url: str) -> None:
    result = runner.invoke(
        main, ["token", "create", "--scope", "root", "--name", "x", "--database-url", db_url]
    )
    assert result.exit_code == 2
    assert "root" in result.stderr and "Traceback" not in result.output


def test_cli_token_list_shows_tokens_without_secrets(runner: CliRunner, db_url: str) -> None:
    token = _create(runner, db_url, "pool-a", "agent")
    token_id, secret = token.split("_")[1], token.split("_", 2)[2]
    result = _run(runner, "token", "list", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    columns = ["ID", "SCOPE", "NODES", "CREATED", "LAST", "USED", "REVOKED", "NAME"]
    assert header.split() == columns
    assert len(rows) == 1
    assert rows[0].split()[:3] == [token_id, "agent", "unbound"]
    assert rows[0].endswith("pool-a")
    assert secret not in result.output and token not in result.output


def test_cli_token_create_binds_an_agent_token_to_its_nodes(runner: CliRunner, db_url: str) -> None:
    """Issue 37: `--node` binds an agent token; `token list` tells bound from unbound."""
    create = ["token", "create", "--scope", "agent", "--name", "rack-7", "--node", "gpu-*"]
    made = _run(runner, *create, "--database-url", db_url)
    assert made.exit_code == 0, made.output
    assert "for nodes 'gpu-*'" in made.stdout
    bound = made.stdout.splitlines()[-1]
    _create(runner, db_url, "simulator", "agent")
    _create(runner, db_url, "grafana", "read")
    listed = _run(runner, "token", "list", "--database-url", db_url)
    nodes = {row.split()[-1]: row.split()[2] for row in listed.stdout.splitlines()[1:]}
    assert nodes == {"rack-7": "gpu-*", "simulator": "unbound", "grafana": "-"}
    as_json = _run(runner, "token", "list", "--json", "--database-url", db_url)
    patterns = {e["name"]: e["node_pattern"] for e in map(json.loads, as_json.stdout.splitlines())}
    assert patterns == {"rack-7": "gpu-*", "simulator": None, "grafana": None}
    with TestClient(create_app(ServerSettings(database_url=db_url))) as client:
        ok = client.post("/v1/ingest", json=make_batch("gpu-001", gpus=1), headers=bearer(bound))
        assert ok.status_code == 200, ok.text
        refused = client.post("/v1/ingest", json=make_batch("cpu-1", gpus=1), headers=bearer(bound))
        assert refused.status_code == 403
        assert "'cpu-1'" in refused.json()["error"]


def test_cli_token_create_binds_agent_tokens_only(runner: CliRunner, db_url: str) -> None:
    create = ["token", "create", "--scope", "read", "--name", "x", "--node", "gpu-*"]
    result = runner.invoke(main, [*create, "--database-url", db_url])
    assert result.exit_code == 2
    assert "--node binds agent tokens only" in result.stderr


def test_cli_token_list_json(runner: CliRunner, db_url: str) -> None:
    token = _create(runner, db_url, "pool-a", "scheduler")
    result = _run(runner, "token", "list", "--json", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["name"], e["scope"], e["revoked_at"]) for e in entries] == [
        ("pool-a", "scheduler", None)
    ]
    assert token.split("_", 2)[2] not in result.output


def test_cli_token_revoke_then_list(runner: CliRunner, db_url: str) -> None:
    token = _create(runner, db_url, "pool-a")
    _create(runner, db_url, "pool-b")
    result = _run(runner, "token", "revoke", "pool-a", "--database-url", db_url)
    assert result.exit_code == 0, result.output
    assert "revoked read token 'pool-a'" in result.stdout

    listed = _run(runner, "token", "list", "--database-url", db_url).stdout
    assert "pool-a" not in listed and "pool-b" in listed
    everything = _run(runner, "token", "list", "--all", "--database-url", db_url).stdout
    header, *rows = everything.splitlines()
    revoked_at = slice(header.index("REVOKED"), header.index("NAME"))
    states = {row[header.index("NAME") :]: row[revoked_at].strip() for row in rows}
    assert states["pool-b"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", states["pool-a"]), states
    with TestClient(create_app(ServerSettings(database_url=db_url))) as client:
        assert client.get("/v1/nodes", headers=bearer(token)).status_code == 401


def test_cli_token_revoke_unknown_is_one_clear_line(runner: CliRunner, db_url: str) -> None:
    _create(runner, db_url, "pool-a")
    result = runner.invoke(main, ["token", "revoke", "nobody", "--database-url", db_url])
    assert result.exit_code != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == ["Error: active token 'nobody' not found"]
    assert "Traceback" not in result.output


def test_cli_token_revoke_ambiguous_name_is_refused(runner: CliRunner, db_url: str) -> None:
    _create(runner, db_url, "dup")
    _create(runner, db_url, "dup")
    result = runner.invoke(main, ["token", "revoke", "dup", "--database-url", db_url])
    assert result.exit_code != 0
    assert "2 active tokens are named 'dup'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_db_upgrade_and_current(runner: CliRunner, db_url: str) -> None:
    head = head_revision()
    before = _run(runner, "db", "current", "--database-url", db_url)
    assert before.exit_code == 0, before.output
    assert before.stdout.strip() == f"current empty, head {head}"

    upgraded = _run(runner, "db", "upgrade", "--database-url", db_url)
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout.strip() == f"schema empty -> {head}"

    after = _run(runner, "db", "current", "--database-url", db_url)
    assert after.stdout.strip() == f"current {head}, head {head}"
    again = _run(runner, "db", "upgrade", "--database-url", db_url)
    assert again.stdout.strip() == f"schema {head} -> {head}"


def test_cli_database_url_from_environment(
    runner: CliRunner, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_SERVER_DATABASE_URL", db_url)
    assert _run(runner, "db", "upgrade").exit_code == 0
    assert _run(runner, "db", "current").stdout.strip().startswith(f"current {head_revision()}")


def test_cli_config_show_lists_every_setting_with_its_env_var(runner: CliRunner) -> None:
    result = _run(runner, "config", "show", "--all")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for name, field in ServerSettings.model_fields.items():
        assert f"{name} = " in out, name
        assert f"[env FLEETWATCH_SERVER_{name.upper()}]" in out, name
        assert field.description and field.description in out, name


def test_cli_config_show_reads_the_environment_and_masks_passwords(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_SERVER_PORT", "9999")
    monkeypatch.setenv("FLEETWATCH_SERVER_DATABASE_URL", "postgresql://fw:s3cret@db.example/fw")
    out = _run(runner, "config", "show").stdout
    assert "port = 9999" in out.splitlines()
    assert "s3cret" not in out
    assert "fw:***@db.example" in out


def test_cli_invalid_setting_is_a_config_error(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_SERVER_PORT", "99999")
    result = runner.invoke(main, ["config", "show"])
    assert result.exit_code == 2
    assert "port" in result.stderr and "Traceback" not in result.output


def test_cli_unreachable_database_is_one_line(runner: CliRunner) -> None:
    for args in (["db", "current"], ["token", "list"]):
        result = runner.invoke(main, [*args, "--database-url", UNREACHABLE_PG])
        assert result.exit_code not in (0, None), args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: database error: "), lines[0]
        assert "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)


def test_cli_debug_shows_the_traceback() -> None:
    # A real process: with --debug the exception escapes click and Python prints it.
    code = "import sys; from fleetwatch.cli import main; sys.exit(main())"
    command = ["db", "current", "--database-url", UNREACHABLE_PG]
    python = [sys.executable, "-c", code]
    quiet = subprocess.run([*python, *command], capture_output=True, text=True, timeout=60)
    loud = subprocess.run(
        [*python, "--debug", *command], capture_output=True, text=True, timeout=60
    )
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert "database error:" in quiet.stderr
    assert loud.returncode != 0
    assert "Traceback (most recent call last)" in loud.stderr
    assert "OperationalError" in loud.stderr


def test_cli_debug_propagates_the_exception_in_process(runner: CliRunner) -> None:
    from sqlalchemy.exc import OperationalError

    result = runner.invoke(main, ["--debug", "db", "current", "--database-url", UNREACHABLE_PG])
    assert isinstance(result.exception, OperationalError)
    assert result.exc_info is not None and result.exc_info[2] is not None


def test_cli_version_and_help(runner: CliRunner) -> None:
    import fleetwatch

    assert (
        _run(runner, "--version").stdout.strip() == f"fleetwatch, version {fleetwatch.__version__}"
    )
    helped = _run(runner, "--help").stdout
    for command in ("server", "db", "token", "config"):
        assert command in helped


def test_cli_server_hands_its_workers_list_settings_that_read_back_as_given(
    runner: CliRunner, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers build their settings from the environment ``fleetwatch server`` fills, where lists
    go as JSON: a comma split of that JSON made ``["Hostname"`` a node label, and remote write
    stored nothing through the CLI's server."""
    import uvicorn

    from fleetwatch.cli import server_cmds

    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(server_cmds, "_check_database", lambda settings: None)
    monkeypatch.setenv("FLEETWATCH_SERVER_REMOTE_WRITE_NODE_LABELS", "node, Hostname")
    with mock.patch.dict(os.environ):
        result = _run(runner, "server", "--database-url", db_url)
        assert result.exit_code == 0, result.output
        handed = os.environ["FLEETWATCH_SERVER_REMOTE_WRITE_NODE_LABELS"]
        worker = ServerSettings(_env_file=None)
    assert json.loads(handed) == ["node", "Hostname"]
    assert worker.remote_write_node_labels == ["node", "Hostname"]
