"""Logging set-up for the CLI: the one place that configures handlers (libraries never do).

A server hands uvicorn the same formatters for its own loggers and its worker processes
(:mod:`fleetwatch.server.log_config`).
"""

from __future__ import annotations

import logging
import sys

from fleetwatch.log_format import QUIET_LOGGERS, line_formatter

__all__ = ["configure_logging"]


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(line_formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level.lower() != "debug":
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
