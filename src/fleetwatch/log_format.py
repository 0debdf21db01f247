"""How a FleetWatch process writes a log line: text or JSON, with credentials masked.

The CLI sets these up for every command (:mod:`fleetwatch.cli.logs`); a server hands the same to
uvicorn for its own loggers and for each worker process it spawns
(:mod:`fleetwatch.server.log_config`), so no line of any process escapes :func:`redact`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from fleetwatch.redaction import redact

__all__ = ["QUIET_LOGGERS", "JsonFormatter", "RedactingFormatter", "line_formatter"]

# Alembic narrates every plugin it loads at INFO; httpx logs every request at INFO (the agent and
# demo log their own summaries). Both are held to WARNING unless the level is debug.
QUIET_LOGGERS = ("alembic", "httpx")


class RedactingFormatter(logging.Formatter):
    """Another formatter's lines, credentials masked: its message, arguments and traceback alike,
    since the finished line is what is masked."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line. Fields are masked before encoding (masking the encoded line could
    cut an escaped quote in half)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry)


def line_formatter(kind: str = "text") -> logging.Formatter:
    """The formatter of FleetWatch's own loggers: ``json`` or ``text`` (``--log-format``)."""
    if kind == "json":
        return JsonFormatter()
    return RedactingFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
