"""The logging configuration uvicorn applies in each process of a server.

uvicorn configures logging itself, from the dictionary it is given: in the process that starts it
and again in every worker process it spawns, which start from nothing (the CLI's own set-up never
runs in them). So the dictionary carries everything a server process logs with, each formatter
behind :class:`~fleetwatch.log_format.RedactingFormatter`: uvicorn's error log and access log in
their usual shape (``INFO:     127.0.0.1:5000 - "GET /v1/nodes HTTP/1.1" 200 OK``), and
FleetWatch's own loggers on the root logger as ``--log-format`` and ``--log-level`` ask, in the
workers too (they had only Python's last-resort handler: warnings and errors, unformatted).
"""

from __future__ import annotations

import logging
from typing import Any

from fleetwatch.log_format import QUIET_LOGGERS, RedactingFormatter

__all__ = ["server_log_config", "uvicorn_formatter"]

_STREAM = "logging.StreamHandler"


def uvicorn_formatter(kind: str, fmt: str, use_colors: bool | None = None) -> logging.Formatter:
    """uvicorn's formatter of that kind (``default`` or ``access``), credentials masked."""
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    inner = AccessFormatter if kind == "access" else DefaultFormatter
    return RedactingFormatter(inner(fmt=fmt, use_colors=use_colors))


def server_log_config(level: str = "info", fmt: str = "text") -> dict[str, Any]:
    """For ``uvicorn.run(log_config=...)``: uvicorn's loggers as uvicorn sets them up by default,
    FleetWatch's at ``level`` in ``fmt`` (text or json)."""
    made_here = f"{__name__}.uvicorn_formatter"
    quiet = (
        {} if level.lower() == "debug" else {name: {"level": "WARNING"} for name in QUIET_LOGGERS}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            # The names uvicorn's own configuration uses ("use_colors" is set there by name).
            "default": {
                "()": made_here,
                "kind": "default",
                "fmt": "%(levelprefix)s %(message)s",
                "use_colors": None,
            },
            "access": {
                "()": made_here,
                "kind": "access",
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
                "use_colors": None,
            },
            "fleetwatch": {"()": "fleetwatch.log_format.line_formatter", "kind": fmt},
        },
        "handlers": {
            "default": {"formatter": "default", "class": _STREAM, "stream": "ext://sys.stderr"},
            "access": {"formatter": "access", "class": _STREAM, "stream": "ext://sys.stdout"},
            "fleetwatch": {
                "formatter": "fleetwatch",
                "class": _STREAM,
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
            **quiet,
        },
        "root": {"handlers": ["fleetwatch"], "level": level.upper()},
    }
