"""``fleetwatch server``, ``db`` and ``token``: the central service's commands.

Server modules are imported inside each command, so a node with only the agent extra can still
run ``fleetwatch --help`` and get a clear message from these.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from fleetwatch.config import ServerSettings, load_server_settings

__all__ = ["db", "server", "token"]

database_option = click.option(
    "--database-url",
    envvar="FLEETWATCH_SERVER_DATABASE_URL",
    help="sqlite:///path.db or postgresql://user@host/db  [env FLEETWATCH_SERVER_DATABASE_URL]",
)


@click.command()
@click.option("--host", help="Address to listen on [default 127.0.0.1]")
@click.option("--port", type=int, help="Port [default 8400]")
@database_option
@click.option("--workers", type=int, help="Worker processes [default 1; PostgreSQL for more]")
@click.option(
    "--role",
    type=click.Choice(["api", "worker", "all"]),
    envvar="FLEETWATCH_SERVER_ROLE",
    help="api: requests only; worker/all: also the background jobs, on one elected leader "
    "[default all] [env FLEETWATCH_SERVER_ROLE]",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    default=None,
    help="Accept requests without tokens, as admin. For local experiments only.",
)
@click.option(
    "--raw-retention-days",
    type=float,
    help="Days raw samples are kept, at least 8 [default 14] "
    "[env FLEETWATCH_SERVER_RAW_RETENTION_DAYS]",
)
@click.option(
    "--rollup-retention-days",
    type=float,
    help="Days hourly rollups are kept [default 730] [env FLEETWATCH_SERVER_ROLLUP_RETENTION_DAYS]",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Serve HTTPS with this PEM certificate chain; re-read when it changes "
    "[env FLEETWATCH_SERVER_TLS_CERT]",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Its PEM private key [env FLEETWATCH_SERVER_TLS_KEY]",
)
@click.option(
    "--tls-client-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Require client certificates from this CA (mutual TLS; tokens are still checked) "
    "[env FLEETWATCH_SERVER_TLS_CLIENT_CA]",
)
def server(
    host: str | None,
    port: int | None,
    database_url: str | None,
    workers: int | None,
    role: str | None,
    insecure_no_auth: bool | None,
    raw_retention_days: float | None,
    rollup_retention_days: float | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
) -> None:
    """Run the central service (REST API, ingest, /metrics)."""
    import uvicorn

    from fleetwatch.errors import ConfigError
    from fleetwatch.server.log_config import server_log_config
    from fleetwatch.server.process_tuning import tune_malloc
    from fleetwatch.server.runtime.leader import single_process_problem
    from fleetwatch.server.tls import server_tls

    settings = load_server_settings(
        host=host,
        port=port,
        database_url=database_url,
        workers=workers,
        role=role,
        insecure_no_auth=insecure_no_auth,
        raw_retention_days=raw_retention_days,
        rollup_retention_days=rollup_retention_days,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
    )
    tls = server_tls(settings)
    if tls is not None:
        tls.check()  # unreadable files fail here, naming them, before the port is bound
    # SQLite serves one process: refuse before anything starts, naming the way out.
    problem = single_process_problem(settings)
    if problem is not None:
        raise ConfigError(problem)
    # Workers are separate processes that build their own app from the environment.
    for key, text in settings_environment(settings).items():
        if text is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = text
    # Before uvicorn starts a thread; its worker processes inherit malloc's settings through the
    # environment.
    tune_malloc(settings)
    _check_database(settings)
    # --log-level and --log-format, for uvicorn to set up in this process and in each worker.
    cli = click.get_current_context().find_root().params
    level = "debug" if cli.get("debug") else str(cli.get("log_level") or "info")
    uvicorn.run(
        "fleetwatch.server.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level="info",
        log_config=server_log_config(level, str(cli.get("log_format") or "text")),
        # Deadlines on each request and a cap on connections (server/http_protocol.py).
        http="fleetwatch.server.http_protocol:GuardedHttpToolsProtocol",
        proxy_headers=True,
        # Each worker process builds its listening context from the files (server/tls.py).
        ssl_context_factory=tls,
    )


def _check_database(settings: ServerSettings) -> None:
    """Fail before binding the port if the database is unreachable or not migrated."""
    from fleetwatch.server.db.migrate import prepare_database
    from fleetwatch.server.db.session import Database, make_engine

    db = Database(make_engine(settings))
    try:
        prepare_database(db.engine, settings)
    finally:
        db.dispose()


def _open_database(database_url: str | None, *, migrate_sqlite: bool = True) -> Any:
    from fleetwatch.server.db.migrate import prepare_database
    from fleetwatch.server.db.session import Database, make_engine

    settings = load_server_settings(database_url=database_url)
    db = Database(make_engine(settings))
    if migrate_sqlite:
        try:
            prepare_database(db.engine, settings)
        except BaseException:
            db.dispose()  # the pool's connection, else left open until the process exits
            raise
    return db


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@database_option
@click.option("--revision", default="head", show_default=True)
def db_upgrade(database_url: str | None, revision: str) -> None:
    """Migrate the database schema (needed before the first start on PostgreSQL)."""
    from fleetwatch.server.db.migrate import current_revision, upgrade

    database = _open_database(database_url, migrate_sqlite=False)
    try:
        before = current_revision(database.engine)
        upgrade(database.engine, revision)
        after = current_revision(database.engine)
    finally:
        database.dispose()
    click.echo(f"schema {before or 'empty'} -> {after}")


@db.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the database's schema revision and this version's head."""
    from fleetwatch.server.db.migrate import current_revision, head_revision

    database = _open_database(database_url, migrate_sqlite=False)
    try:
        click.echo(
            f"current {current_revision(database.engine) or 'empty'}, head {head_revision()}"
        )
    finally:
        database.dispose()


@click.group()
def token() -> None:
    """API tokens (scopes: agent, read, scheduler, admin)."""


@token.command("create")
@click.option("--scope", required=True, type=click.Choice(["agent", "read", "scheduler", "admin"]))
@click.option("--name", required=True, help="Who or what uses it, e.g. pool-a")
@click.option(
    "--node",
    "node_pattern",
    metavar="NAME|PATTERN",
    help="Agent tokens: bind it to the nodes matching this name or shell pattern (gpu-*); it "
    "may then push, validate and report job events for those nodes only. Unbound: any node",
)
@database_option
def token_create(scope: str, name: str, node_pattern: str | None, database_url: str | None) -> None:
    """Create a token and print it once, alone on the last line."""
    from fleetwatch.server.auth import create_token

    if node_pattern is not None and scope != "agent":
        raise click.UsageError("--node binds agent tokens only (--scope agent)")
    database = _open_database(database_url)
    try:
        with database.write() as conn:
            secret, info = create_token(conn, name=name, scope=scope, node_pattern=node_pattern)
    finally:
        database.dispose()
    bound = f", for nodes {info.node_pattern!r}" if info.node_pattern is not None else ""
    click.echo(
        f"created {info.scope} token {info.name!r} (id {info.token_id}{bound}); "
        "it is shown only now, store it safely:"
    )
    click.echo(secret)


@token.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@database_option
def token_list(include_revoked: bool, as_json: bool, database_url: str | None) -> None:
    """List tokens (never their secrets)."""
    from fleetwatch.server.auth import list_tokens

    database = _open_database(database_url)
    try:
        with database.read() as conn:
            tokens = list_tokens(conn, include_revoked=include_revoked)
    finally:
        database.dispose()
    if as_json:
        for t in tokens:
            click.echo(
                json.dumps({k: str(v) if v is not None else None for k, v in vars(t).items()})
            )
        return
    click.echo(
        f"{'ID':<14}{'SCOPE':<11}{'NODES':<16}{'CREATED':<22}{'LAST USED':<22}{'REVOKED':<22}NAME"
    )
    for t in tokens:
        click.echo(
            f"{t.token_id:<14}{t.scope:<11}{_nodes(t.scope, t.node_pattern):<15} "
            f"{_when(t.created_at):<22}{_when(t.last_used_at):<22}{_when(t.revoked_at):<22}{t.name}"
        )


def _nodes(scope: str, pattern: str | None) -> str:
    """What an agent token may speak for: its pattern, or ``unbound`` (any node)."""
    if scope != "agent":
        return "-"
    return pattern if pattern is not None else "unbound"


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


@token.command("revoke")
@click.argument("key")
@database_option
def token_revoke(key: str, database_url: str | None) -> None:
    """Revoke a token by id or name; it stops working at once."""
    from fleetwatch.server.auth import revoke_token

    database = _open_database(database_url)
    try:
        with database.write() as conn:
            info = revoke_token(conn, key)
    finally:
        database.dispose()
    click.echo(f"revoked {info.scope} token {info.name!r} (id {info.token_id})")


def settings_environment(settings: ServerSettings) -> dict[str, str | None]:
    """The environment a worker process reads ``settings`` back from: None is left unset
    (str(None) would read back as the text "None"); lists go as JSON. Secrets are left out: they
    have no flag, and workers read them from the same environment (a dump would mask them)."""
    out: dict[str, str | None] = {}
    for name, value in settings.model_dump(mode="json", exclude={"secret_keys"}).items():
        key = f"FLEETWATCH_SERVER_{name.upper()}"
        if value is None:
            out[key] = None
        else:
            out[key] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return out
