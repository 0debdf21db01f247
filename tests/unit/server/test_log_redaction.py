"""Credentials masked out of log lines: the rules, the formatters, and the configuration uvicorn
applies in a server's every process, applied here in a fresh interpreter as a spawned worker
applies it. The real server process: tests/faults/test_credentials_not_logged.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from fleetwatch.log_format import line_formatter
from fleetwatch.redaction import MASK, redact

TOKEN = "fwt_3a97c0ffee12_Vq3x-Pq_7rT0aB9cD8eF7gH6iJ5kL4mN3oP2qR1sT0u"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (f'1.2.3.4:5 - "GET /?token={TOKEN} HTTP/1.1" 303', f'"GET /?token={MASK} HTTP/1.1" 303'),
        (f"GET /?horizon=7d&token={TOKEN}&top=5", f"/?horizon=7d&token={MASK}&top=5"),
        (f"/v1/nodes/{TOKEN}/gpus", f"/v1/nodes/fwt_{MASK}/gpus"),
        (f"failed for {TOKEN}.", f"failed for fwt_{MASK}."),
        ("/x?access_token=a&api_key=b&password=c", f"access_token={MASK}&api_key={MASK}&password="),
        ("/x?client_secret=a;X-Amz-Signature=b", f"client_secret={MASK};X-Amz-Signature={MASK}"),
        ("/x?session=a&auth=b&jwt=c", f"session={MASK}&auth={MASK}&jwt={MASK}"),
        ("/x?fwt%5Fabc%5Fdef", f"/x?fwt_{MASK}"),
        ("Authorization: Bearer abc.def", f"Authorization: {MASK}"),
        ("proxy-authorization: Basic Zm9vOmJhcg==", f"proxy-authorization: {MASK}"),
        ("Cookie: fleetwatch_session=abc; b=c", f"Cookie: {MASK}"),
        ("(b'authorization', b'Bearer xyz'), (b'cookie', b'a=1')", f"(b'cookie', b'{MASK}')"),
        ('{"X-Api-Key": "k-123"}', f'{{"X-Api-Key": "{MASK}"}}'),
        ("retry with bearer abc123", f"bearer {MASK}"),
    ],
)
def test_credentials_are_masked(text: str, masked: str) -> None:
    assert masked in redact(text)
    assert redact(redact(text)) == redact(text)


@pytest.mark.parametrize(
    "text",
    [
        '127.0.0.1:5 - "GET /v1/maintenance?key_prefix=rack&horizon=7d HTTP/1.1" 200',
        "dropped the legacy cookie, and signed in",
        "GET /metrics?shard=1&shards=4",
        "",
    ],
)
def test_what_is_no_credential_is_left_alone(text: str) -> None:
    assert redact(text) == text


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError(f"boom with {TOKEN}")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("fleetwatch.x", logging.ERROR, __file__, 1, message, args, exc_info)


@pytest.mark.parametrize("kind", ["text", "json"])
def test_the_line_formatters_mask_messages_arguments_and_tracebacks(kind: str) -> None:
    line = line_formatter(kind).format(
        _record("token %s in %s", TOKEN, f"/?token={TOKEN}", exc=True)
    )
    assert TOKEN not in line and TOKEN.split("_", 2)[2] not in line
    assert "RuntimeError: boom with fwt_" in line
    if kind == "json":
        entry = json.loads(line)
        assert entry["msg"] == f"token fwt_{MASK} in /?token={MASK}"


# What uvicorn does in a worker process it spawned: Config(log_config=...).configure_logging(),
# then its loggers and the app's log. Printed lines come back on stdout and stderr.
_WORKER = f"""
import logging, sys
from uvicorn.config import Config
from fleetwatch.server.log_config import server_log_config
config = server_log_config("info", sys.argv[1])
Config(app="x:y", log_config=config, log_level="info").configure_logging()
token = {TOKEN!r}
logging.getLogger("uvicorn.access").info(
    '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/?token=" + token, "1.1", 303
)
logging.getLogger("uvicorn.error").warning("odd request %s", "/v1/nodes/" + token)
logging.getLogger("fleetwatch.server.x").info("a message holding %s", token)
try:
    raise ValueError("Authorization: Bearer " + token)
except ValueError:
    logging.getLogger("fleetwatch.server.x").exception("failed")
logging.getLogger("alembic.runtime").info("quiet below warning")
"""


@pytest.mark.parametrize("kind", ["text", "json"])
def test_a_worker_process_configured_as_uvicorn_does_masks_every_line(kind: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, kind], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert TOKEN.split("_", 2)[2] not in out
    assert f'"GET /?token={MASK} HTTP/1.1" 303' in done.stdout  # the access log, as uvicorn's
    assert f"odd request /v1/nodes/fwt_{MASK}" in done.stderr
    assert f"a message holding fwt_{MASK}" in done.stderr  # FleetWatch's own, in the worker too
    assert "ValueError: Authorization: " + MASK in done.stderr.replace("\\n", "\n")
    assert "quiet below warning" not in out
    if kind == "json":
        assert json.loads(done.stderr.splitlines()[-1])["logger"] == "fleetwatch.server.x"
