"""Logging set-up for the CLI: the one place that configures handlers (libraries never do)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["configure_logging"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level.lower() != "debug":
        # Alembic narrates every plugin it loads at INFO.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # httpx logs every request at INFO; the agent and demo log their own summaries.
        logging.getLogger("httpx").setLevel(logging.WARNING)
