"""Webhook secrets encrypted at rest with the server's keys (Fernet, rotatable).

A stored secret reads ``fernet:<token>``: AES-128-CBC + HMAC-SHA256 under the newest key of
``FLEETWATCH_SERVER_SECRET_KEYS``; every listed key decrypts (cryptography's ``MultiFernet``), so
keys rotate without downtime: put a new key first, restart, run ``fleetwatch secrets rotate``
(re-encrypts every secret with it), then drop the old key. A value without the prefix is plain text
from before encryption: it still works, and the server encrypts it at start-up.

Without configured keys the embedded SQLite deployment keeps a generated key beside its database
(``<database>.key``, mode 0600, logged where); PostgreSQL deployments must configure keys, and a
webhook with a secret is refused, naming the setting, until they do.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import select, update
from sqlalchemy.engine import make_url

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import webhook_subscriptions

__all__ = [
    "MAX_SECRET_BYTES",
    "PREFIX",
    "SecretBox",
    "SecretUnreadable",
    "load_secret_box",
    "reseal_secrets",
]

logger = logging.getLogger(__name__)

PREFIX = "fernet:"
# The column is text (schema 0005); the bound is the wire's, as before encryption (256).
MAX_SECRET_BYTES = 256
SETTING = "FLEETWATCH_SERVER_SECRET_KEYS"


class SecretUnreadable(ValueError):
    """A stored secret that none of the server's keys decrypts."""


class SecretBox:
    """Seals and opens secrets with a list of keys, newest first. ``key_file``, when the keys came
    from one, is read again when a secret does not open (another process rotated the file)."""

    def __init__(self, keys: Sequence[bytes], *, key_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._key_file = key_file
        self._fernet = MultiFernet([Fernet(k) for k in keys]) if keys else None

    @property
    def can_seal(self) -> bool:
        return self._fernet is not None

    def seal(self, secret: str) -> str:
        if len(secret.encode()) > MAX_SECRET_BYTES:
            raise InvalidInput(
                f"secret is longer than {MAX_SECRET_BYTES} bytes",
                [{"loc": ["body", "secret"], "msg": f"at most {MAX_SECRET_BYTES} bytes (UTF-8)"}],
            )
        if self._fernet is None:
            raise InvalidInput(
                f"this server has no key to encrypt webhook secrets at rest: set {SETTING} "
                "(make a key with `fleetwatch secrets generate-key`)",
                [{"loc": ["body", "secret"], "msg": f"the server needs {SETTING} to store it"}],
            )
        return PREFIX + self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str | None) -> str | None:
        """The secret in clear; a plain-text value (stored before encryption) as it is."""
        if stored is None or not stored.startswith(PREFIX):
            return stored
        token = stored[len(PREFIX) :].encode()
        try:
            return self._decrypt(token)
        except SecretUnreadable:
            if self._key_file is None or not self._reload():
                raise
        return self._decrypt(token)

    def reseal(self, stored: str) -> str:
        """``stored`` encrypted with the newest key (plain text included)."""
        if not stored.startswith(PREFIX):
            return self.seal(stored)
        if self._fernet is None:
            raise SecretUnreadable(f"no key to re-encrypt with: set {SETTING}")
        try:
            return PREFIX + self._fernet.rotate(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken as exc:
            raise SecretUnreadable("no key of this server decrypts this secret") from exc

    def _decrypt(self, token: bytes) -> str:
        if self._fernet is None:
            raise SecretUnreadable(f"this secret is encrypted and {SETTING} is not set")
        try:
            return self._fernet.decrypt(token).decode()
        except InvalidToken as exc:
            raise SecretUnreadable(
                f"no key of this server decrypts this secret; check {SETTING}"
            ) from exc

    def _reload(self) -> bool:
        assert self._key_file is not None
        with self._lock:
            keys = read_key_file(self._key_file)
            if not keys:
                return False
            self._fernet = MultiFernet([Fernet(k) for k in keys])
            return True


def read_key_file(path: Path) -> list[bytes]:
    """The keys of a key file, newest first: one a line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [line.strip().encode() for line in text.splitlines() if line.strip()]


def write_key_file(path: Path, keys: Sequence[bytes]) -> None:
    """Replace the key file atomically, readable by its owner only."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("".join(k.decode() + "\n" for k in keys))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, path)


def _create_key_file(path: Path) -> None:
    """A fresh key in ``path``, unless another process (a second worker) made one first."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.new")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(Fernet.generate_key().decode() + "\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(temp, path)  # atomic, and fails where the file exists: the first one wins
    except FileExistsError:
        pass
    else:
        logger.warning(
            "generated the key that encrypts webhook secrets at %s (mode 0600): back it up with "
            "the database, or set %s",
            path,
            SETTING,
        )
    finally:
        temp.unlink()


def key_file_for(settings: ServerSettings) -> Path | None:
    """Where the embedded SQLite deployment keeps its generated key; None for PostgreSQL and
    in-memory SQLite."""
    if not settings.is_sqlite:
        return None
    name = make_url(settings.database_url).database
    if not name or name == ":memory:":
        return None
    return Path(name + ".key")


def load_secret_box(settings: ServerSettings) -> SecretBox:
    """The server's keys: the setting's, else the SQLite key file (made on first use)."""
    if settings.secret_keys:
        return SecretBox([k.get_secret_value().encode() for k in settings.secret_keys])
    if not settings.is_sqlite:
        return SecretBox([])  # PostgreSQL: secrets need a configured key
    path = key_file_for(settings)
    if path is None:  # in-memory database: its secrets die with the process, and so may the key
        return SecretBox([Fernet.generate_key()])
    if not path.exists():
        _create_key_file(path)
    if path.stat().st_mode & 0o077:
        logger.warning("%s is readable by others: chmod 600 it", path)
    return SecretBox(read_key_file(path), key_file=path)


def reseal_secrets(db: Database, box: SecretBox, *, plaintext_only: bool) -> tuple[int, int]:
    """Encrypt stored webhook secrets with the newest key: (re-encrypted, left as they were).

    ``plaintext_only`` (the server's start-up) seals only values stored before encryption. A value
    no key decrypts is left and logged.
    """
    if not box.can_seal:
        return 0, 0
    done = left = 0
    table = webhook_subscriptions
    with db.write() as conn:
        rows = conn.execute(
            select(table.c.id, table.c.name, table.c.secret).where(
                table.c.secret.is_not(None), table.c.secret != ""
            )
        ).all()
        for row in rows:
            if plaintext_only and row.secret.startswith(PREFIX):
                continue
            try:
                sealed = box.reseal(row.secret)
            except (SecretUnreadable, InvalidInput) as exc:
                logger.error("webhook %s (%s): secret left as it is: %s", row.id, row.name, exc)
                left += 1
                continue
            # Compare-and-set: a concurrent rotation by another process wins, not both.
            conn.execute(
                update(table)
                .where(table.c.id == row.id, table.c.secret == row.secret)
                .values(secret=sealed)
            )
            done += 1
    return done, left
