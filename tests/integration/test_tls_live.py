"""TLS end to end (issue 37): a real ``fleetwatch server --tls-cert --tls-key [--tls-client-ca]``
and real clients (the agent, the CLI, the scheduler client, the StepReporter), with certificates
made here (tests/certs.py).

One server per mode for the module: HTTPS with the certificate behind a kubelet-style symlink
(``tls.crt -> ..data/tls.crt``, ``..data`` swapped to renew) and a 0.2 s reload check, and HTTPS
requiring client certificates. The renewal test waits for what a new connection is served (a
condition, up to a minute), never for a fixed time.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from cryptography import x509

from fleetwatch.adapters.client import SchedulerClient
from fleetwatch.cli import main
from fleetwatch.client import StepReporter
from fleetwatch.client_tls import ClientTls
from tests.certs import Authority, Issued
from tests.factories import make_batch, make_validation
from tests.integration.live import LiveServer, create_token, live_server

pytestmark = [pytest.mark.slow]

NVIDIA_SMI_XML = "fixtures/nvidia_smi/xml/telegraf__a10g.xml"


@dataclass
class Pki:
    root: Path
    ca: Authority
    ca_file: Path
    rogue: Authority
    rogue_file: Path

    def context(self, cert: Issued | None = None, *, ca: Authority | None = None) -> ssl.SSLContext:
        """A client's context: trusts ``ca`` (default: the fleet's), presents ``cert``."""
        context = ssl.create_default_context(cadata=(ca or self.ca).cert_pem.decode())
        if cert is not None:
            context.load_cert_chain(*self.files(cert))
        return context

    def files(self, cert: Issued) -> tuple[Path, Path]:
        return cert.write(self.root / "clients", f"c{cert.serial}")

    def serve(self, version: str, cert: Issued) -> None:
        """Point ``..data`` at a directory holding ``cert``, in one rename (kubelet's swap)."""
        directory = self.root / "served" / version
        directory.mkdir(parents=True)
        (directory / "tls.crt").write_bytes(cert.cert_pem)
        (directory / "tls.key").write_bytes(cert.key_pem)
        staged = self.root / "served" / "..data_tmp"
        staged.symlink_to(version)
        os.replace(staged, self.root / "served" / "..data")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = Authority("fleet-ca"), Authority("rogue-ca")
    pki = Pki(root, ca, ca.write(root), rogue, rogue.write(root))
    pki.serve("v1", ca.server())
    for name in ("tls.crt", "tls.key"):
        (root / "served" / name).symlink_to(f"..data/{name}")
    return pki


@dataclass
class Served:
    server: LiveServer
    tokens: dict[str, str]


def _start(
    pki: Pki, tmp: Path, *flags: str, verify: ssl.SSLContext, database_url: str | None = None
) -> Iterator[Served]:
    database_url = database_url or f"sqlite:///{tmp / 'fleetwatch.db'}"
    tokens = {s: create_token(database_url, s, f"tls-{s}") for s in ("agent", "read", "scheduler")}
    tls = ["--tls-cert", str(pki.root / "served/tls.crt"), "--tls-key"]
    tls.append(str(pki.root / "served/tls.key"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLEETWATCH_SERVER_TLS_RELOAD_CHECK_S", "0.2")
        env.setenv("FLEETWATCH_SERVER_BACKGROUND_JOBS", "false")  # only requests matter here
        with live_server(database_url, tmp, *tls, *flags, verify=verify) as server:
            yield Served(server, tokens)


@pytest.fixture(scope="module")
def https(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _start(pki, tmp_path_factory.mktemp("https"), verify=pki.context())


@pytest.fixture(scope="module")
def mutual(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    probe = pki.context(pki.ca.issue("readiness-probe", client=True))
    tmp = tmp_path_factory.mktemp("mtls")
    yield from _start(pki, tmp, "--tls-client-ca", str(pki.ca_file), verify=probe)


@pytest.fixture
def runner() -> Iterator[CliRunner]:
    """The CLI in this process; its logging set-up (it replaces the root handlers) undone."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield CliRunner()
    root.handlers[:], root.level = saved


def _agent_once(
    runner: CliRunner, served: Served, node: str, spool: Path, shared: Path, *tls: str
) -> tuple[int, str]:
    collect = ["--collectors", "nvidia-smi", "--nvidia-smi", str(shared / NVIDIA_SMI_XML)]
    push = ["--server-url", served.server.url, "--token", served.tokens["agent"]]
    where = ["--node-name", node, "--spool-dir", str(spool)]
    result = runner.invoke(
        main,
        ["agent", "--once", *collect, *push, *where, *tls],
        env={"FLEETWATCH_AGENT_TOKEN": None},
    )
    return result.exit_code, result.output


def _node_known(served: Served, node: str) -> bool:
    with served.server.client(served.tokens["read"]) as client:
        return client.get(f"/v1/nodes/{node}").status_code == 200


def _served_certificate(port: int, context: ssl.SSLContext) -> x509.Certificate:
    """The certificate a new connection is served (a handshake that fails raises)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _port(served: Served) -> int:
    return int(served.server.url.rsplit(":", 1)[1])


def _eventually(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)


# -- HTTPS ------------------------------------------------------------------------------------


def test_tls_agent_pushes_over_https_with_its_ca_bundle(
    https: Served, pki: Pki, runner: CliRunner, shared_dir: Path, tmp_path: Path
) -> None:
    spool, ca = tmp_path / "spool", str(pki.ca_file)
    code, output = _agent_once(runner, https, "tls-node-1", spool, shared_dir, "--ca-bundle", ca)
    assert code == 0, output
    assert _node_known(https, "tls-node-1")


def test_tls_clients_refuse_a_server_their_ca_did_not_sign(
    https: Served, pki: Pki, runner: CliRunner, shared_dir: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    code, output = _agent_once(
        runner, https, "tls-node-2", spool, shared_dir, "--ca-bundle", str(pki.rogue_file)
    )
    assert code != 0 and "left in the spool" in output, output
    assert not _node_known(https, "tls-node-2")
    for verify in (pki.context(ca=pki.rogue), True):  # the rogue CA; the public roots
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{https.server.url}/healthz", verify=verify)


def test_tls_server_speaks_tls_1_2_and_newer_only(https: Served, pki: Pki) -> None:
    old = pki.context()
    with warnings.catch_warnings():  # deprecated it is: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError):
        _served_certificate(_port(https), old)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = pki.context()
        context.minimum_version = context.maximum_version = version
        assert _served_certificate(_port(https), context).subject


def _serves(port: int, context: ssl.SSLContext, serial: int) -> bool:
    try:
        return _served_certificate(port, context).serial_number == serial
    except ssl.SSLCertVerificationError:
        return False  # still the expired one


def _refuses_as_expired(port: int, context: ssl.SSLContext) -> bool:
    try:
        _served_certificate(port, context)
    except ssl.SSLCertVerificationError as exc:
        return "expired" in str(exc)
    return False


def test_tls_renewed_certificate_is_served_without_a_restart(https: Served, pki: Pki) -> None:
    """cert-manager renews: the symlink swaps, the same process serves the new certificate to
    new connections; an expired one swapped in is refused by clients, and replaced again."""
    port, context = _port(https), pki.context()
    renewed = pki.ca.server()
    pki.serve("v2", renewed)
    _eventually(lambda: _serves(port, context, renewed.serial), "renewed certificate served")

    long_ago = datetime.now(UTC) - timedelta(days=30)
    pki.serve("v3", pki.ca.server(valid_from=long_ago, valid_until=long_ago + timedelta(days=7)))
    _eventually(lambda: _refuses_as_expired(port, context), "expired certificate refused")
    with pytest.raises(httpx.ConnectError, match="expired"):
        httpx.get(f"{https.server.url}/healthz", verify=context)

    again = pki.ca.server()
    pki.serve("v4", again)
    _eventually(lambda: _serves(port, context, again.serial), "renewed again")
    assert https.server.process.poll() is None  # never restarted
    assert "TLS certificate reloaded" in https.server.log.read_text()


# -- mutual TLS -------------------------------------------------------------------------------


def test_mtls_refuses_a_client_without_a_certificate_of_its_ca(mutual: Served, pki: Pki) -> None:
    stranger = pki.rogue.issue("node-a", client=True)
    for context in (pki.context(), pki.context(stranger)):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{mutual.server.url}/healthz", verify=context)
    assert httpx.get(f"{mutual.server.url}/healthz", verify=mutual.server.verify).status_code == 200


def test_mtls_still_checks_the_bearer_token(mutual: Served, pki: Pki) -> None:
    context = pki.context(pki.ca.issue("node-a", client=True))
    with httpx.Client(base_url=mutual.server.url, verify=context) as client:
        assert client.post("/v1/ingest", json=make_batch("node-a", gpus=1)).status_code == 401
        forged = {"Authorization": "Bearer fwt_000000000000_forged"}
        assert client.get("/v1/nodes", headers=forged).status_code == 401


def test_mtls_a_node_certificate_speaks_for_its_own_node_only(mutual: Served, pki: Pki) -> None:
    agent = {"Authorization": f"Bearer {mutual.tokens['agent']}"}
    by_cn = pki.context(pki.ca.issue("node-a", client=True))
    by_san = pki.context(
        pki.ca.issue("unrelated", dns=("gpu-7.rack.example", "gpu-7"), client=True)
    )
    with httpx.Client(base_url=mutual.server.url, verify=by_cn, headers=agent) as node_a:
        assert node_a.post("/v1/ingest", json=make_batch("node-a", gpus=1)).status_code == 200
        refused = node_a.post("/v1/ingest", json=make_batch("node-b", gpus=1))
        assert refused.status_code == 403, refused.text
        assert "'node-b'" in refused.json()["error"] and "node-a" in refused.json()["error"]
        validation = node_a.post("/v1/nodes/node-b/validations", json=make_validation("node-b"))
        assert validation.status_code == 403, validation.text
        assert "'node-b'" in validation.json()["error"]
    with httpx.Client(base_url=mutual.server.url, verify=by_san, headers=agent) as gpu_7:
        assert gpu_7.post("/v1/ingest", json=make_batch("gpu-7", gpus=1)).status_code == 200
        assert gpu_7.post("/v1/ingest", json=make_batch("unrelated", gpus=1)).status_code == 200
        assert gpu_7.post("/v1/ingest", json=make_batch("node-a", gpus=1)).status_code == 403


def test_mtls_every_client_presents_its_certificate(
    mutual: Served,
    pki: Pki,
    runner: CliRunner,
    shared_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent (flags), the CLI's API calls and the StepReporter (the shared environment
    variables) and the scheduler adapters' client: one set of TLS options."""
    cert, key = pki.files(pki.ca.issue("tls-agent-node", client=True))
    tls = ["--ca-bundle", str(pki.ca_file), "--client-cert", str(cert), "--client-key", str(key)]
    spool = tmp_path / "spool"
    code, output = _agent_once(runner, mutual, "tls-agent-node", spool, shared_dir, *tls)
    assert code == 0, output
    with ExitStack() as stack:
        admin_cert = pki.files(pki.ca.issue("operator", client=True))
        scheduler = SchedulerClient.connect(
            mutual.server.url,
            mutual.tokens["scheduler"],
            tls=ClientTls(pki.ca_file, *admin_cert),
        )
        stack.callback(scheduler.close)
        assert scheduler.list_evictions("pending") == []

        monkeypatch.setenv("FLEETWATCH_CA_BUNDLE", str(pki.ca_file))
        monkeypatch.setenv("FLEETWATCH_CLIENT_CERT", str(admin_cert[0]))
        monkeypatch.setenv("FLEETWATCH_CLIENT_KEY", str(admin_cert[1]))
        listed = runner.invoke(
            main,
            [
                "maintenance",
                "list",
                "--server",
                mutual.server.url,
                "--token",
                mutual.tokens["read"],
            ],
        )
        assert listed.exit_code == 0, listed.output
        monkeypatch.delenv("FLEETWATCH_CLIENT_CERT")
        monkeypatch.delenv("FLEETWATCH_CLIENT_KEY")
        refused = runner.invoke(
            main,
            [
                "maintenance",
                "list",
                "--server",
                mutual.server.url,
                "--token",
                mutual.tokens["read"],
            ],
        )
        assert refused.exit_code != 0 and "cannot reach" in refused.output, refused.output

        node_cert = pki.files(pki.ca.issue("tls-train-node", client=True))
        monkeypatch.setenv("FLEETWATCH_CLIENT_CERT", str(node_cert[0]))
        monkeypatch.setenv("FLEETWATCH_CLIENT_KEY", str(node_cert[1]))
        reporter = StepReporter(
            mutual.server.url,
            mutual.tokens["agent"],
            job_id="tls-job",
            rank=0,
            node="tls-train-node",
            notices=False,
            flush_interval_s=0.05,
        )
        with reporter:
            for step in range(5):
                reporter.step(step, duration_ms=100.0)
        assert reporter.sent == 5 and reporter.rejected == 0


@pytest.mark.postgres
def test_tls_every_worker_process_serves_https(
    pki: Pki, migrated_postgres_url: str, tmp_path: Path
) -> None:
    """``--workers 2``: each worker process builds its own listening context (uvicorn hands them
    ServerTls by pickling it); fresh connections, spread by the kernel, all complete TLS."""
    started = _start(
        pki, tmp_path, "--workers", "2", verify=pki.context(), database_url=migrated_postgres_url
    )
    served = next(started)
    try:
        for _ in range(24):
            with httpx.Client(verify=pki.context()) as fresh:
                assert fresh.get(f"{served.server.url}/readyz").status_code == 200
        log = served.server.log.read_text()
        assert log.count("Started server process") >= 2, log
    finally:
        started.close()
