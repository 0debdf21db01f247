"""Every client's TLS options (fleetwatch.client_tls) and the agent's refusal of plain HTTP.

Handshakes with these options against a real server: tests/integration/test_tls_live.py.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from tests.certs import Authority

from fleetwatch.agent.factory import build_agent
from fleetwatch.cli import main
from fleetwatch.client_tls import ClientTls, is_loopback_url
from fleetwatch.config import load_agent_settings
from fleetwatch.errors import ConfigError

SHARED_ENV = ("FLEETWATCH_CA_BUNDLE", "FLEETWATCH_CLIENT_CERT", "FLEETWATCH_CLIENT_KEY")


@pytest.fixture(autouse=True)
def _no_tls_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SHARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in ("CA_BUNDLE", "CLIENT_CERT", "CLIENT_KEY", "ALLOW_INSECURE_HTTP", "SERVER_URL"):
        monkeypatch.delenv(f"FLEETWATCH_AGENT_{name}", raising=False)


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8400", True),
        ("http://127.8.9.10", True),
        ("http://[::1]:8400/", True),
        ("http://localhost:8400", True),
        ("http://LOCALHOST.:8400", True),
        ("http://fleetwatch:8400", False),
        ("http://10.0.0.5:8400", False),
        ("http://127.0.0.1.example.com", False),
        ("http://[::ffff:10.0.0.1]", False),
    ],
)
def test_is_loopback_url(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_client_tls_without_options_verifies_against_public_roots() -> None:
    assert ClientTls().verify() is True


def test_client_tls_reads_the_shared_environment_under_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = Authority("fleet-ca")
    ca_file = ca.write(tmp_path)
    cert, key = ca.issue("node-a", client=True).write(tmp_path, "node-a")
    monkeypatch.setenv("FLEETWATCH_CA_BUNDLE", str(ca_file))
    monkeypatch.setenv("FLEETWATCH_CLIENT_CERT", str(cert))
    monkeypatch.setenv("FLEETWATCH_CLIENT_KEY", str(key))
    assert ClientTls.from_env() == ClientTls(ca_file, cert, key)
    assert ClientTls.from_env(ca_bundle="given.pem").ca_bundle == Path("given.pem")
    context = ClientTls.from_env().verify()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "fleet-ca"),),)]


def test_client_tls_names_the_file_it_cannot_load(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    cert, _ = ca.issue("node-a", client=True).write(tmp_path, "node-a")
    _, other_key = ca.issue("node-b", client=True).write(tmp_path, "node-b")
    with pytest.raises(ConfigError, match="cannot read the CA bundle .*missing.pem"):
        ClientTls(ca_bundle=tmp_path / "missing.pem").verify()
    with pytest.raises(ConfigError, match="cannot load the client certificate .*node-a.crt"):
        ClientTls(client_cert=cert, client_key=other_key).verify()
    with pytest.raises(ConfigError, match="--client-key needs --client-cert"):
        ClientTls(client_key=other_key).verify()


def test_agent_reads_its_own_tls_settings_before_the_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_CA_BUNDLE", "/shared/ca.pem")
    monkeypatch.setenv("FLEETWATCH_CLIENT_CERT", "/shared/node.crt")
    settings = load_agent_settings()
    assert settings.ca_bundle == Path("/shared/ca.pem")
    assert settings.client_cert == Path("/shared/node.crt") and settings.client_key is None
    monkeypatch.setenv("FLEETWATCH_AGENT_CA_BUNDLE", "/agent/ca.pem")
    assert load_agent_settings().ca_bundle == Path("/agent/ca.pem")
    config = tmp_path / "agent.toml"
    config.write_text('client_cert = "/file/node.crt"\n')
    assert load_agent_settings(config).client_cert == Path("/file/node.crt")
    assert load_agent_settings(config, client_cert="/flag.crt").client_cert == Path("/flag.crt")


@pytest.mark.parametrize(
    "url", ["http://fleetwatch.example:8400", "http://10.0.0.5:8400", "HTTP://gpu-head:8400"]
)
def test_agent_refuses_to_send_its_token_over_plain_http_to_another_machine(
    url: str, tmp_path: Path
) -> None:
    settings = load_agent_settings(server_url=url, token="t", spool_dir=tmp_path)
    with pytest.raises(ConfigError, match="plain HTTP to another machine") as refused:
        build_agent(settings, collectors=[])
    assert "--allow-insecure-http" in str(refused.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8400", "http://localhost:8400"])
def test_agent_sends_plain_http_to_loopback_without_a_word(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_agent_settings(server_url=url, token="t", spool_dir=tmp_path)
    with caplog.at_level(logging.WARNING):
        build_agent(settings, collectors=[])
    assert "in clear" not in caplog.text


def test_agent_allowed_insecure_http_says_so_in_its_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETWATCH_AGENT_ALLOW_INSECURE_HTTP", "true")
    url = "http://fleetwatch.example:8400"
    settings = load_agent_settings(server_url=url, token="t", spool_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="fleetwatch.agent.factory"):
        build_agent(settings, collectors=[])
    assert f"sending the agent token in clear over plain HTTP to {url}" in caplog.text


def test_agent_cli_refuses_plain_http_with_a_config_error(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level  # the CLI sets up logging; given back below
    agent = ["agent", "--once", "--collectors", "nvidia-smi", "--token", "t"]
    try:
        result = CliRunner().invoke(
            main, [*agent, "--server-url", "http://fw:8400", "--spool-dir", str(tmp_path)]
        )
    finally:
        root.handlers[:], root.level = saved
    assert result.exit_code == 2, result.output
    assert "plain HTTP to another machine" in result.output


@pytest.mark.parametrize(
    "command",
    [
        ("agent",),
        ("validate",),
        ("slurm-sync",),
        ("k8s-sync",),
        ("webhook", "add"),
        ("webhook", "list"),
        ("maintenance", "add"),
        ("maintenance", "list"),
        ("maintenance", "end"),
    ],
    ids=" ".join,
)
def test_every_command_that_calls_the_server_takes_the_tls_options(command: tuple[str]) -> None:
    found: click.Command = main
    for name in command:
        assert isinstance(found, click.Group)
        found = found.commands[name]
    options = {opt for param in found.params for opt in getattr(param, "opts", ())}
    assert {"--ca-bundle", "--client-cert", "--client-key"} <= options
    if command[0] in ("agent", "validate"):
        assert "--allow-insecure-http" in options
