"""Webhook secrets at rest: encrypted with the server key, rotated, plain text upgraded."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from tests.conftest import TEST_SECRET_KEY, bearer

from fleetwatch.cli import main
from fleetwatch.config import ServerSettings
from fleetwatch.notify.webhooks import verify_signature
from fleetwatch.server.app import create_app
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.secret_box import PREFIX, SecretBox, key_file_for, load_secret_box
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import webhook_subscriptions
from fleetwatch.server.tell.outbox import OutboxWorker

SECRET = "hmac-key-for-the-receiver"


def _stored(db: Database) -> dict[str, str | None]:
    with db.read() as conn:
        rows = conn.execute(select(webhook_subscriptions.c.name, webhook_subscriptions.c.secret))
        return {row.name: row.secret for row in rows}


def _subscribe(client: TestClient, admin: str, name: str = "ops", **body: Any) -> httpx.Response:
    sent = {"name": name, "kind": "generic", "url": "http://receiver.test/hook", **body}
    return client.post("/v1/webhooks", json=sent, headers=bearer(admin))


def _delivered_signature_checks(client: TestClient, db: Database, secret: str) -> list[bool]:
    """Send every webhook's test delivery; whether each body verifies against ``secret``."""
    seen: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    box = client.app.state.secret_box  # type: ignore[attr-defined]
    settings = client.app.state.settings  # type: ignore[attr-defined]
    http = httpx.Client(transport=httpx.MockTransport(receive))
    worker = OutboxWorker(db, settings, client=http, secrets=box)
    try:
        worker.run_once()
    finally:
        worker.close()
    return [
        verify_signature(
            secret,
            r.headers["X-FleetWatch-Timestamp"],
            r.content,
            r.headers["X-FleetWatch-Signature"],
        )
        for r in seen
    ]


def test_a_webhook_secret_is_stored_encrypted_and_still_signs(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    made = _subscribe(client, tokens["admin"], secret=SECRET)
    assert made.status_code == 201, made.text
    stored = _stored(db)["ops"]
    assert stored is not None and stored.startswith(PREFIX) and SECRET not in stored
    assert SecretBox([TEST_SECRET_KEY.encode()]).open(stored) == SECRET
    client.post(f"/v1/webhooks/{made.json()['id']}/test", headers=bearer(tokens["admin"]))
    assert _delivered_signature_checks(client, db, SECRET) == [True]


def test_plaintext_secrets_keep_working_and_are_encrypted_at_the_next_start(
    settings: ServerSettings, client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    with db.write() as conn:  # a row from before encryption at rest
        conn.execute(
            insert(webhook_subscriptions).values(
                name="old", kind="generic", url="http://receiver.test/hook", secret=SECRET,
                filters={}, enabled=True, created_at=utcnow(),
            )
        )  # fmt: skip
    hook_id = client.get("/v1/webhooks", headers=bearer(tokens["admin"])).json()["data"][0]["id"]
    client.post(f"/v1/webhooks/{hook_id}/test", headers=bearer(tokens["admin"]))
    assert _delivered_signature_checks(client, db, SECRET) == [True]
    with TestClient(create_app(settings)):  # a restart
        pass
    stored = _stored(db)["old"]
    assert stored is not None and stored.startswith(PREFIX)
    assert SecretBox([TEST_SECRET_KEY.encode()]).open(stored) == SECRET


def test_rotate_re_encrypts_with_the_newest_key(
    settings: ServerSettings, client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    assert _subscribe(client, tokens["admin"], secret=SECRET).status_code == 201
    before = _stored(db)["ops"]
    new_key = Fernet.generate_key().decode()
    env = {
        "FLEETWATCH_SERVER_SECRET_KEYS": f"{new_key},{TEST_SECRET_KEY}",
        "FLEETWATCH_SERVER_DATABASE_URL": settings.database_url,
    }
    result = CliRunner().invoke(main, ["secrets", "rotate"], env=env)
    assert result.exit_code == 0, result.output
    assert "re-encrypted 1 webhook secret" in result.output
    after = _stored(db)["ops"]
    assert after != before
    assert SecretBox([new_key.encode()]).open(after) == SECRET  # the old key is not needed


def test_a_secret_too_long_is_refused_naming_the_field(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = _subscribe(client, tokens["admin"], secret="é" * 129)  # 258 bytes in UTF-8
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "secret"]
    # The longest secret fits the column once encrypted (text since schema 0005).
    assert _subscribe(client, tokens["admin"], secret="é" * 128).status_code == 201


@pytest.mark.postgres
def test_postgresql_without_a_key_refuses_secrets_naming_the_setting(
    migrated_postgres_url: str,
) -> None:
    settings = ServerSettings(  # type: ignore[call-arg]
        database_url=migrated_postgres_url, background_jobs=False, _env_file=None
    )
    with TestClient(create_app(settings)) as client:
        from fleetwatch.server.auth import create_token

        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            admin, _ = create_token(conn, name="pg-nokey-admin", scope="admin")
        refused = _subscribe(client, admin, name="pg-nokey", secret=SECRET)
        assert refused.status_code == 422
        assert "FLEETWATCH_SERVER_SECRET_KEYS" in refused.json()["error"]
        plain = _subscribe(client, admin, name="pg-nokey-plain")  # no secret: nothing to hide
        assert plain.status_code == 201
        client.delete(f"/v1/webhooks/{plain.json()['id']}", headers=bearer(admin))


def test_sqlite_without_a_key_makes_a_private_key_file_and_rotates_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    settings = ServerSettings(database_url=url, background_jobs=False, _env_file=None)  # type: ignore[call-arg]
    with TestClient(create_app(settings)) as client:
        from fleetwatch.server.auth import create_token

        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            admin, _ = create_token(conn, name="admin", scope="admin")
        assert _subscribe(client, admin, secret=SECRET).status_code == 201
        key_file = key_file_for(settings)
        assert key_file is not None and key_file == tmp_path / "fw.db.key"
        mode = stat.S_IMODE(os.stat(key_file).st_mode)
        assert mode == 0o600
        old_key = key_file.read_text()

        result = CliRunner().invoke(
            main, ["secrets", "rotate"], env={"FLEETWATCH_SERVER_DATABASE_URL": url}
        )
        assert result.exit_code == 0, result.output
        assert key_file.read_text() != old_key and len(key_file.read_text().split()) == 1
        # The running server never saw the new key: it reads the file again and still signs.
        hook_id = client.get("/v1/webhooks", headers=bearer(admin)).json()["data"][0]["id"]
        client.post(f"/v1/webhooks/{hook_id}/test", headers=bearer(admin))
        assert _delivered_signature_checks(client, db, SECRET) == [True]
        assert load_secret_box(settings).open(_stored(db)["ops"]) == SECRET


def test_generate_key_prints_a_usable_key() -> None:
    result = CliRunner().invoke(main, ["secrets", "generate-key"])
    key = result.output.strip()
    settings = ServerSettings(secret_keys=key, _env_file=None)  # type: ignore[call-arg,arg-type]
    assert (
        len(key) == 44
        and SecretBox([key.encode()]).open(SecretBox([key.encode()]).seal("s")) == "s"
    )
    assert settings.secret_keys[0].get_secret_value() == key


def test_a_bad_key_in_the_setting_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetwatch.config import load_server_settings
    from fleetwatch.errors import ConfigError

    monkeypatch.setenv("FLEETWATCH_SERVER_SECRET_KEYS", "not-a-key")
    with pytest.raises(ConfigError, match="secret_keys: .*not a Fernet key") as raised:
        load_server_settings()
    assert "not-a-key" not in str(raised.value)  # a key is never echoed back
