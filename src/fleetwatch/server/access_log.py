"""Which requests uvicorn's access log writes: by default not each accepted push.

At fleet scale ``POST /v1/ingest`` answers 200 about 200 times a second (12,500 nodes pushing
every minute): an access line each is 17 million lines a day that say what
``fleetwatch_ingest_batches_total{outcome="accepted"}`` counts, and writing them cost about 3 %
of an API process's CPU (py-spy, 100,000 GPUs). A refused push (4xx), a failed one (5xx) and
every other request keep their line.
"""

from __future__ import annotations

import logging

__all__ = ["ACCESS_LOGGER", "AcceptedPushFilter", "log_accepted_pushes"]

ACCESS_LOGGER = "uvicorn.access"
INGEST_PATH = "/v1/ingest"


class AcceptedPushFilter(logging.Filter):
    """Drops uvicorn's access record of a push answered 200."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's record: (client address, method, path with query, HTTP version, status).
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        return not (method == "POST" and path == INGEST_PATH and status == 200)


def log_accepted_pushes(enabled: bool) -> None:
    """Log accepted pushes or not, whatever an app built earlier in this process chose."""
    logger = logging.getLogger(ACCESS_LOGGER)
    for installed in [f for f in logger.filters if isinstance(f, AcceptedPushFilter)]:
        logger.removeFilter(installed)
    if not enabled:
        logger.addFilter(AcceptedPushFilter())
