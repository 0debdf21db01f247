"""A running dcgm-exporter: scrape its ``/metrics`` (or read a file) every interval.

Many fleets already run dcgm-exporter; reading it costs the node nothing extra. Its
``DCGM_FI_DEV_XID_ERRORS`` is the code of the *last* Xid, not a count: a change of it becomes an
``xid`` event (the first value seen is only a baseline, since it may be days old).
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import httpx

from fleetwatch.agent.collectors.base import Collection, readings_to_collection
from fleetwatch.agent.parsers import ParseError
from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_scrape
from fleetwatch.errors import CollectorError
from fleetwatch.telemetry import Event

__all__ = ["DcgmExporterCollector"]

logger = logging.getLogger(__name__)


class DcgmExporterCollector:
    name: ClassVar[str] = "dcgm-exporter"

    def __init__(self, source: str, *, client: httpx.Client | None = None) -> None:
        self._source = source
        self._client = client or httpx.Client(timeout=5.0)
        self._last_xid: dict[str, int] | None = None

    def _read(self) -> str:
        if self._source.startswith(("http://", "https://")):
            try:
                response = self._client.get(self._source)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                raise CollectorError(f"scraping {self._source} failed: {exc}") from exc
            return response.text
        try:
            return Path(self._source.removeprefix("file://")).read_text()
        except OSError as exc:
            raise CollectorError(f"reading {self._source} failed: {exc}") from exc

    def collect(self, now: datetime) -> Collection:
        try:
            scrape = parse_dcgm_scrape(self._read())
        except ParseError as exc:
            raise CollectorError(f"{self._source} is not Prometheus text: {exc}") from exc
        collection = readings_to_collection(scrape.readings, now)
        if self._last_xid is not None:
            for uuid, xid in scrape.last_xid.items():
                if xid and xid != self._last_xid.get(uuid):
                    collection.events.append(
                        Event(
                            kind="xid",
                            ts=now,
                            uuid=uuid,
                            xid=xid,
                            message="reported by dcgm-exporter (DCGM_FI_DEV_XID_ERRORS)",
                        )
                    )
        self._last_xid = dict(scrape.last_xid)
        return collection

    def close(self) -> None:
        self._client.close()
