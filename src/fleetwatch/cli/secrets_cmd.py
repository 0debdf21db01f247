"""``fleetwatch secrets generate-key|rotate``: the keys that encrypt webhook secrets at rest."""

from __future__ import annotations

import click

from fleetwatch.cli.server_cmds import database_option
from fleetwatch.config import load_server_settings

__all__ = ["secrets"]


@click.group()
def secrets() -> None:
    """Keys that encrypt webhook secrets at rest (FLEETWATCH_SERVER_SECRET_KEYS)."""


@secrets.command("generate-key")
def generate_key() -> None:
    """Print a new key for FLEETWATCH_SERVER_SECRET_KEYS."""
    from cryptography.fernet import Fernet

    click.echo(Fernet.generate_key().decode())


@secrets.command("rotate")
@database_option
def rotate(database_url: str | None) -> None:
    """Re-encrypt every stored webhook secret with the newest key.

    With FLEETWATCH_SERVER_SECRET_KEYS: with its first key (put the new key first on every server
    and restart them before, drop the old one after). With the embedded SQLite's key file: a new
    key is generated into it, and the old ones leave it once every secret is re-encrypted;
    running servers pick the new key up by themselves.
    """
    from cryptography.fernet import Fernet

    from fleetwatch.errors import FleetWatchError
    from fleetwatch.server.db.secret_box import (
        SecretBox,
        key_file_for,
        load_secret_box,
        read_key_file,
        reseal_secrets,
        write_key_file,
    )
    from fleetwatch.server.db.session import Database, make_engine

    settings = load_server_settings(database_url=database_url)
    key_file = None if settings.secret_keys else key_file_for(settings)
    if key_file is not None:
        old = read_key_file(key_file)
        keys = [Fernet.generate_key(), *old]
        write_key_file(key_file, keys)  # old keys stay until nothing needs them
        box = SecretBox(keys)
    else:
        box = load_secret_box(settings)
        if not box.can_seal:
            raise FleetWatchError(
                "no key to rotate to: set FLEETWATCH_SERVER_SECRET_KEYS "
                "(`fleetwatch secrets generate-key` makes one)"
            )
    db = Database(make_engine(settings))
    try:
        done, left = reseal_secrets(db, box, plaintext_only=False)
    finally:
        db.dispose()
    if key_file is not None and not left:
        write_key_file(key_file, keys[:1])
        click.echo(f"new key in {key_file}; the old keys are removed")
    click.echo(f"re-encrypted {done} webhook secret(s) with the newest key")
    if left:
        raise FleetWatchError(
            f"{left} webhook secret(s) could not be re-encrypted (no key decrypts them, or too "
            "long): see the log; recreate those webhooks with their secrets"
        )
