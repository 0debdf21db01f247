#!/usr/bin/env python
"""What TLS costs ingest: the real ``fleetwatch server`` over plain HTTP, HTTPS and mutual TLS,
side by side in one run, server CPU per GPU row.

For each mode (``plain``; ``tls``: ``--tls-cert/--tls-key``; ``mtls``: also
``--tls-client-ca``, each node presenting a certificate that names it) this script starts the
server on a fresh database (SQLite, or a throwaway PostgreSQL database with ``--database-url``)
and drives it with N simulated nodes (8 GPUs, every canonical field, batches of K ticks), closed
loop, one push in flight per node, in two ways:

- ``fresh``: a new connection for every push, as a real fleet does: an agent pushes once a
  minute and the server closes a connection idle for 5 s, so every push pays a TCP handshake
  and, over TLS, a full TLS handshake (ECDHE with the server's P-256 key; for mTLS, the client's
  certificate verified too);
- ``kept``: one kept-alive connection per node, the shape of benchmarks/ingest.py: what TLS costs
  per byte alone (record encryption), handshakes amortised away.

The server's CPU (its process and workers, from /proc) over the timed window, divided by the GPU
rows it acknowledged, is the figure; each mode's stored rows are checked against those
acknowledged. The load generator is a minimal HTTP/1.1 client on asyncio (TLS by Python's ssl
module), whose own CPU is not counted. Certificates are made here (EC P-256, ``cryptography``).

Run: ``.venv/bin/python benchmarks/ingest_tls.py [--nodes 32] [--duration 10] [--database-url
postgresql://...]``; ``--smoke``: plain and tls, toy sizes, seconds (tests/benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from ingest import Backend, PostgresBackend, SqliteBackend, encode, log, make_fleet
from procstats import machine, proc_cpu_s, process_tree
from rawhttp import read_response
from serverproc import running_server

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine

MODES = ("plain", "tls", "mtls")
CONNECTIONS = ("fresh", "kept")


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


class Pki:
    """A CA, the server's certificate and, on demand, a client certificate per node."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-ca")])
        self._name = name
        now = datetime.now(UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.crt"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.server_cert, self.server_key = self._issue("server", server=True)

    def _issue(self, common_name: str, *, server: bool = False) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_file, key_file = self.dir / f"{common_name}.crt", self.dir / f"{common_name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_file, key_file

    def client_context(self, node: str | None) -> ssl.SSLContext:
        """A client's context trusting the CA, presenting ``node``'s certificate if named."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if node is not None:
            context.load_cert_chain(*self._issue(node))
        return context


# --------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    pushes: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


async def _node_loop(
    port: int,
    head: bytes,
    bodies: list[bytes],
    context: ssl.SSLContext | None,
    fresh: bool,
    until: float,
    tally: Tally,
) -> None:
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    try:
        while time.perf_counter() < until and bodies:
            body = bodies.pop()
            started = time.perf_counter()
            try:
                if connection is None:
                    connection = await asyncio.open_connection(
                        "127.0.0.1",
                        port,
                        ssl=context,
                        server_hostname="127.0.0.1" if context else None,
                    )
                reader, writer = connection
                close = b"Connection: close\r\n" if fresh else b""
                writer.writelines((head, close, b"Content-Length: %d\r\n\r\n" % len(body), body))
                status, payload, closing = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError, ssl.SSLError) as exc:
                tally.errors.append(f"{type(exc).__name__}: {exc}")
                closing, status, payload = True, 0, b""
            tally.latencies.append(time.perf_counter() - started)
            if status == 200:
                tally.pushes += 1
                tally.rows += json.loads(payload)["accepted"]["samples"]
            elif status:
                tally.errors.append(f"{status}: {payload[:200]!r}")
            if closing or fresh:
                if connection is not None:
                    await _close(connection[1])
                connection = None
    finally:
        if connection is not None:
            await _close(connection[1])


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass  # the server closed first (Connection: close): nothing left to say


async def _drive(
    port: int,
    head: bytes,
    bodies: list[list[bytes]],
    contexts: list[ssl.SSLContext | None],
    fresh: bool,
    seconds: float,
) -> Tally:
    until = time.perf_counter() + seconds
    tallies = [Tally() for _ in bodies]
    await asyncio.gather(
        *(
            _node_loop(port, head, own, context, fresh, until, tally)
            for own, context, tally in zip(bodies, contexts, tallies, strict=True)
        )
    )
    out = Tally()
    for tally in tallies:
        out.pushes += tally.pushes
        out.rows += tally.rows
        out.errors += tally.errors
        out.latencies += tally.latencies
    return out


# --------------------------------------------------------------------------------------------
# One mode
# --------------------------------------------------------------------------------------------


def _agent_token(url: str) -> str:
    settings = ServerSettings(database_url=url, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    try:
        upgrade(db.engine)
        with db.write() as conn:
            token, _ = create_token(conn, name="bench-agent", scope="agent")
    finally:
        db.dispose()
    return token


def bench_mode(
    mode: str, args: argparse.Namespace, workdir: Path, pki: Pki
) -> list[dict[str, Any]]:
    directory = workdir / mode
    directory.mkdir()
    backend: Backend = (
        PostgresBackend(args.database_url) if args.database_url else SqliteBackend(directory)
    )
    try:
        return _bench_backend(mode, backend, args, directory, pki)
    finally:
        backend.drop()


def _bench_backend(
    mode: str, backend: Backend, args: argparse.Namespace, directory: Path, pki: Pki
) -> list[dict[str, Any]]:
    token = _agent_token(backend.url)
    fleet = make_fleet(f"{mode}-node", args.nodes, args.gpus, args.seed)
    flags: list[str] = []
    contexts: list[ssl.SSLContext | None] = [None] * len(fleet)
    verify = None
    if mode != "plain":
        flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
        verify = pki.client_context(None)
        contexts = [verify] * len(fleet)
    if mode == "mtls":
        flags += ["--tls-client-ca", str(pki.ca_file)]
        # Each node proves who it is: the server lets it speak for that node only.
        contexts = [pki.client_context(node.name) for node in fleet]
        verify = pki.client_context("readiness-probe")
    env = {"FLEETWATCH_SERVER_BACKGROUND_JOBS": "false"}
    rows: list[dict[str, Any]] = []
    with running_server(
        backend.url, directory, args.server_workers, env, extra_args=flags, verify=verify
    ) as server:
        port = int(server.url.rsplit(":", 1)[1])
        head = (
            f"POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        ).encode()
        acknowledged = 0
        for connections in args.connections:
            fresh = connections == "fresh"
            per_node = max(4, int(args.bodies_per_node))
            log(f"{mode}/{connections}: building {per_node} bodies for each of {len(fleet)} nodes")
            warm = [
                [encode(node.batch(args.ticks), False) for _ in range(per_node)] for node in fleet
            ]
            timed = [
                [encode(node.batch(args.ticks), False) for _ in range(per_node)] for node in fleet
            ]
            warmup = asyncio.run(_drive(port, head, warm, contexts, fresh, args.warmup))
            pids = process_tree(server.process.pid)
            cpu0 = sum(proc_cpu_s(pid) for pid in pids)
            wall0 = time.perf_counter()
            tally = asyncio.run(_drive(port, head, timed, contexts, fresh, args.duration))
            wall = time.perf_counter() - wall0
            cpu = sum(proc_cpu_s(pid) for pid in pids) - cpu0
            acknowledged += warmup.rows + tally.rows
            if any(not bodies for bodies in timed):
                log(f"{mode}/{connections}: a node ran out of bodies; raise --bodies-per-node")
            latencies = sorted(tally.latencies) or [0.0]
            rows.append(
                {
                    "mode": mode,
                    "connections": connections,
                    "pushes": tally.pushes,
                    "rows": tally.rows,
                    "errors": len(tally.errors) + len(warmup.errors),
                    "error_samples": (warmup.errors + tally.errors)[:5],
                    "seconds": wall,
                    "server_cpu_s": cpu,
                    "server_cpu_us_per_row": 1e6 * cpu / tally.rows if tally.rows else None,
                    "server_cpu_us_per_push": 1e6 * cpu / tally.pushes if tally.pushes else None,
                    "p50_ms": 1e3 * statistics.median(latencies),
                }
            )
            log(
                f"{mode}/{connections}: {tally.pushes} pushes, {tally.rows} rows in {wall:.1f} s, "
                f"server {cpu:.2f} CPU-s, {len(tally.errors)} errors"
            )
    stored = backend.samples()
    for row in rows:
        row["stored_equals_acknowledged"] = stored == acknowledged
    if stored != acknowledged:
        log(f"{mode}: stored {stored} rows, acknowledged {acknowledged}")
    return rows


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{results['args']['nodes']} nodes x {results['args']['gpus']} GPUs, "
        f"{results['args']['ticks']}-tick pushes ({results['rows_per_push']} GPU rows), "
        f"{results['database']}, {results['machine']['cpus']} CPUs "
        f"({results['machine']['cpu_model']}), load {results['machine']['loadavg_at_start']}",
        "",
        "| mode | connections | pushes/s | server CPU per GPU row | per push | p50 | "
        "stored = acked | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    plain = {r["connections"]: r for r in results["runs"] if r["mode"] == "plain"}
    for row in results["runs"]:
        base = plain.get(row["connections"])
        extra = ""
        if (
            base
            and row["mode"] != "plain"
            and base["server_cpu_us_per_row"]
            and row["server_cpu_us_per_row"]
        ):
            extra = f" ({row['server_cpu_us_per_row'] / base['server_cpu_us_per_row']:.2f}x plain)"
        lines.append(
            f"| {row['mode']} | {row['connections']} | {_num(row['pushes'] / row['seconds'])} | "
            f"{_num(row['server_cpu_us_per_row'])} µs{extra} | "
            f"{_num(row['server_cpu_us_per_push'], 0)} µs | {_num(row['p50_ms'])} ms | "
            f"{'yes' if row['stored_equals_acknowledged'] else '**NO**'} | {row['errors']} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--ticks", type=int, default=6, help="ticks per push (6: a minute of 10 s)")
    p.add_argument("--duration", type=float, default=10.0, help="timed seconds per run")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument(
        "--modes", type=lambda v: v.split(","), default=list(MODES), help="plain,tls,mtls"
    )
    p.add_argument(
        "--connections", type=lambda v: v.split(","), default=list(CONNECTIONS), help="fresh,kept"
    )
    p.add_argument("--bodies-per-node", type=int, default=400, help="bodies built per node per run")
    p.add_argument("--server-workers", type=int, default=1)
    p.add_argument("--database-url", help="PostgreSQL server URL (a throwaway database on it)")
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--json", type=Path, help="write every number to this file")
    p.add_argument("--smoke", action="store_true", help="plain and tls, toy sizes, seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.nodes, args.gpus, args.ticks, args.bodies_per_node = 2, 2, 2, 8
        args.duration, args.warmup, args.modes = 0.5, 0.1, ["plain", "tls"]
    unknown = set(args.modes) - set(MODES) | set(args.connections) - set(CONNECTIONS)
    if unknown:
        raise SystemExit(f"unknown mode or connections: {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows_per_push": args.gpus * args.ticks,
        "database": "PostgreSQL" if args.database_url else "SQLite",
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="fleetwatch-bench-tls-") as tmp:
        workdir = Path(tmp)
        pki = Pki(workdir)
        for mode in args.modes:
            results["runs"] += bench_mode(mode, args, workdir, pki)
    ok = all(r["errors"] == 0 and r["stored_equals_acknowledged"] for r in results["runs"])
    results["ok"] = ok
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
