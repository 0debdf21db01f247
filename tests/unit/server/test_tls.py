"""The server's TLS context and its renewal without a restart, through real handshakes.

Each handshake here is OpenSSL's own, client and server in this process, bytes passed through
memory BIOs instead of a socket; tests/integration/test_tls_live.py does the same through a real
``fleetwatch server``. The reloader's clock is a counter the test moves, so "the check is due"
never depends on how fast the machine is.
"""

from __future__ import annotations

import logging
import os
import pickle
import ssl
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.certs import Authority, Issued

from fleetwatch.config import ServerSettings
from fleetwatch.errors import ConfigError
from fleetwatch.server.client_certs import CERT_NAMES_KEY, tls_extension
from fleetwatch.server.tls import CertificateReloader, ServerTls, server_tls


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _handshake(
    server: ssl.SSLContext, client: ssl.SSLContext
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """A completed handshake; ``ssl.SSLError`` from the side that refused."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    near = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    far = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, obj in (("client", near), ("server", far)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
            s_in.write(c_out.read())
            c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server judges the client's certificate after the client is done; a
            # refusal reaches the client as an alert on its first read.
            near.write(b"ping")
            s_in.write(c_out.read())
            assert far.read(4) == b"ping"
            return near, far
    raise AssertionError("handshake did not finish")


def _client(ca: Authority, cert: Issued | None = None, tmp: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    if cert is not None:
        assert tmp is not None
        context.load_cert_chain(*cert.write(tmp, f"client-{cert.serial}"))
    return context


def _served_serial(reloader: CertificateReloader, ca: Authority) -> int:
    near, _ = _handshake(reloader.listening, _client(ca))
    der = near.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509

    return int(x509.load_der_x509_certificate(der).serial_number)


def _install(issued: Issued, cert: Path, key: Path) -> None:
    """Replace both files at once, as cert-manager's writer does (rename over the old)."""
    for data, target in ((issued.cert_pem, cert), (issued.key_pem, key)):
        fresh = target.with_suffix(".new")
        fresh.write_bytes(data)
        os.replace(fresh, target)


def test_server_tls_refuses_tls_1_1_and_serves_1_2(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    cert, key = ca.server().write(tmp_path, "server")
    listening = ServerTls(cert, key)(None, ssl.create_default_context)
    assert listening.minimum_version == ssl.TLSVersion.TLSv1_2
    old = _client(ca)
    with warnings.catch_warnings():  # deprecated it is: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError):
        _handshake(listening, old)
    tls12 = _client(ca)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    near, _ = _handshake(listening, tls12)
    assert near.version() == "TLSv1.2"


def test_reloader_serves_a_renewed_certificate_from_the_next_due_check(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    first, renewed = ca.server(), ca.server()
    cert, key = first.write(tmp_path, "server")
    clock = Clock()
    reloader = CertificateReloader(ServerTls(cert, key, reload_check_s=5.0), clock=clock)
    assert _served_serial(reloader, ca) == first.serial
    _install(renewed, cert, key)
    clock.now += 4.9
    assert _served_serial(reloader, ca) == first.serial  # not checked yet: no stat() per hello
    clock.now += 0.2
    assert _served_serial(reloader, ca) == renewed.serial
    assert _served_serial(reloader, ca) == renewed.serial
    assert reloader.reloads == 1


def test_reloader_follows_a_symlink_swap(tmp_path: Path) -> None:
    """kubelet's secret volumes: tls.crt -> ..data/tls.crt, and ..data is swapped to a new
    directory in one rename."""
    ca = Authority("fleet-ca")
    first, renewed = ca.server(), ca.server()
    for version, issued in (("v1", first), ("v2", renewed)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "tls.crt").write_bytes(issued.cert_pem)
        (tmp_path / version / "tls.key").write_bytes(issued.key_pem)
    (tmp_path / "..data").symlink_to("v1")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    clock = Clock()
    tls = ServerTls(tmp_path / "tls.crt", tmp_path / "tls.key", reload_check_s=1.0)
    reloader = CertificateReloader(tls, clock=clock)
    assert _served_serial(reloader, ca) == first.serial
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.now += 1.0
    assert _served_serial(reloader, ca) == renewed.serial


def test_reloader_keeps_serving_when_the_new_files_do_not_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Files caught mid-rotation (the new certificate beside the old key) change nothing; the
    set is loaded once it is whole."""
    ca = Authority("fleet-ca")
    first, renewed = ca.server(), ca.server()
    cert, key = first.write(tmp_path, "server")
    clock = Clock()
    reloader = CertificateReloader(ServerTls(cert, key, reload_check_s=1.0), clock=clock)
    cert.write_bytes(renewed.cert_pem)  # the key not yet
    with caplog.at_level(logging.WARNING, logger="fleetwatch.server.tls"):
        for _ in range(3):
            clock.now += 1.0
            assert _served_serial(reloader, ca) == first.serial
    warnings = [r for r in caplog.records if "do not load" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    key.write_bytes(renewed.key_pem)
    clock.now += 1.0
    assert _served_serial(reloader, ca) == renewed.serial


def test_reloader_takes_a_new_client_ca(tmp_path: Path) -> None:
    ca, other = Authority("fleet-ca"), Authority("new-client-ca")
    cert, key = ca.server().write(tmp_path, "server")
    client_ca = ca.write(tmp_path, "clients")
    clock = Clock()
    reloader = CertificateReloader(ServerTls(cert, key, client_ca, 1.0), clock=clock)
    node = other.issue("node-a", client=True)
    with pytest.raises(ssl.SSLError):
        _handshake(reloader.listening, _client(ca, node, tmp_path))
    os.replace(other.write(tmp_path, "staged"), client_ca)
    clock.now += 1.0
    _, far = _handshake(reloader.listening, _client(ca, node, tmp_path))
    assert tls_extension(far)[CERT_NAMES_KEY] == {"node-a"}


def test_mutual_tls_refuses_a_client_without_certificate(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    cert, key = ca.server().write(tmp_path, "server")
    tls = ServerTls(cert, key, ca.write(tmp_path))
    with pytest.raises(ssl.SSLError):
        _handshake(tls(None, ssl.create_default_context), _client(ca))


def test_tls_extension_names_a_verified_client_certificate(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    cert, key = ca.server().write(tmp_path, "server")
    mutual = ServerTls(cert, key, ca.write(tmp_path))(None, ssl.create_default_context)
    node = ca.issue("GPU-001", dns=("gpu-001.rack7.example", "gpu-001"), client=True)
    _, far = _handshake(mutual, _client(ca, node, tmp_path))
    extension = tls_extension(far)
    assert extension[CERT_NAMES_KEY] == {"gpu-001", "gpu-001.rack7.example"}
    assert extension["client_cert_name"] == "CN=GPU-001"
    assert extension["tls_version"] in (0x0303, 0x0304)
    assert extension["client_cert_chain"][0].startswith("-----BEGIN CERTIFICATE-----")
    # Without client certificates the connection names nobody.
    plain = ServerTls(cert, key)(None, ssl.create_default_context)
    _, far = _handshake(plain, _client(ca, node, tmp_path))
    assert tls_extension(far)[CERT_NAMES_KEY] is None


def test_server_tls_check_names_the_files_that_do_not_load(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    cert, _ = ca.server().write(tmp_path, "server")
    _, wrong_key = ca.server().write(tmp_path, "other")
    with pytest.raises(ConfigError, match="cannot load the TLS files") as refused:
        ServerTls(cert, wrong_key).check()
    assert str(cert) in str(refused.value) and str(wrong_key) in str(refused.value)
    with pytest.raises(ConfigError, match="missing.crt"):
        ServerTls(tmp_path / "missing.crt", wrong_key).check()


def test_server_tls_travels_to_worker_processes(tmp_path: Path) -> None:
    """uvicorn hands its factory to each worker process by pickling it."""
    tls = ServerTls(tmp_path / "a.crt", tmp_path / "a.key", tmp_path / "ca.crt", 2.5)
    assert pickle.loads(pickle.dumps(tls)) == tls


def test_server_tls_settings_go_together(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        ServerSettings(tls_cert=cert, _env_file=None)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="tls_client_ca needs tls_cert"):
        ServerSettings(tls_client_ca=cert, _env_file=None)  # type: ignore[call-arg]
    assert server_tls(ServerSettings(_env_file=None)) is None  # type: ignore[call-arg]
    settings = ServerSettings(tls_cert=cert, tls_key=key, _env_file=None)  # type: ignore[call-arg]
    assert server_tls(settings) == ServerTls(cert, key, None, 5.0)


def test_an_expired_server_certificate_is_refused(tmp_path: Path) -> None:
    ca = Authority("fleet-ca")
    long_ago = datetime.now(UTC) - timedelta(days=30)
    expired = ca.server(valid_from=long_ago, valid_until=long_ago + timedelta(days=7))
    listening = ServerTls(*expired.write(tmp_path, "server"))(None, ssl.create_default_context)
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        _handshake(listening, _client(ca))


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--tls-cert", "{dir}/server.crt"), "tls_cert and tls_key go together"),
        (("--tls-cert", "{dir}/server.crt", "--tls-key", "{dir}/other.key"), "cannot load the TLS"),
        (("--tls-client-ca", "{dir}/server.crt"), "tls_client_ca needs tls_cert"),
    ],
)
def test_server_command_refuses_tls_files_before_it_starts(
    tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    from click.testing import CliRunner

    from fleetwatch.cli import main

    ca = Authority("fleet-ca")
    ca.server().write(tmp_path, "server")
    ca.server().write(tmp_path, "other")
    args = [flag.format(dir=tmp_path) for flag in flags]
    root = logging.getLogger()
    saved = root.handlers[:], root.level  # the CLI sets up logging; given back below
    try:
        result = CliRunner().invoke(
            main, ["server", *args, "--database-url", f"sqlite:///{tmp_path / 'fw.db'}"]
        )
    finally:
        root.handlers[:], root.level = saved
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not (tmp_path / "fw.db").exists()  # refused before the database was touched
