"""The two calls of Prometheus' HTTP API the history import makes: which metric names exist
(``/api/v1/label/__name__/values``) and one range query (``/api/v1/query_range``).

Every failure becomes a :class:`~fleetwatch.errors.SourceError` naming the URL: the server
unreachable, an HTTP error, or an answer whose ``status`` is not ``success`` (Prometheus'
``error`` text is passed on, e.g. its limit of 11,000 points per series).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from fleetwatch.errors import SourceError
from fleetwatch.remote_write.wire import Series

__all__ = ["MAX_POINTS_PER_SERIES", "PrometheusApi"]

MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses a range query resolving to more


class PrometheusApi:
    """Prometheus at ``client``'s base URL (auth, TLS and timeouts are the client's)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def metric_names(self, start: datetime, end: datetime) -> list[str]:
        """The metric names with samples between ``start`` and ``end``."""
        params = {"start": _seconds(start), "end": _seconds(end)}
        data = self._get("/api/v1/label/__name__/values", params)
        return sorted(str(name) for name in data)

    def query_range(
        self, query: str, start: datetime, end: datetime, step_s: float
    ) -> list[Series]:
        """``query`` evaluated every ``step_s`` from ``start`` to ``end`` (both included), one
        :class:`Series` (labels, [(ms, value)]) per result series."""
        params = {"query": query, "start": _seconds(start), "end": _seconds(end), "step": step_s}
        data = self._get("/api/v1/query_range", params)
        if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
            raise SourceError(f"{query}: Prometheus answered no matrix", self._url("query_range"))
        return [
            Series(
                labels=dict(one["metric"]),
                samples=[(round(float(ts) * 1000), float(value)) for ts, value in one["values"]],
            )
            for one in data["result"]
        ]

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        url = self._url(path)
        try:
            response = self._client.get(path, params=dict(params))
        except httpx.HTTPError as exc:
            raise SourceError(f"Prometheus at {url} unreachable: {exc}", url) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, Mapping) or body.get("status") != "success":
            detail = body.get("error") if isinstance(body, Mapping) else None
            raise SourceError(
                f"Prometheus at {url} answered {response.status_code}: "
                f"{detail or response.text[:200] or response.reason_phrase}",
                url,
            )
        return body.get("data")

    def _url(self, path: str) -> str:
        return str(self._client.base_url.join(path))


def _seconds(t: datetime) -> str:
    return f"{t.timestamp():.3f}"
