"""A scrape as Prometheus remote-writes it: each sample of an exposition page as one series with
the scrape's timestamp and the target's labels. For tests, benchmarks and tools; the server never
reads text."""

from __future__ import annotations

import re
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from fleetwatch.remote_write.wire import Series

__all__ = ["scrape_series"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def scrape_series(
    text: str, ts_ms: int, target_labels: Mapping[str, str] | None = None
) -> list[Series]:
    """The series Prometheus would send for one scrape of ``text`` at ``ts_ms``, each carrying
    ``target_labels`` (``job``, ``instance``, external labels) unless the page set the label."""
    # prometheus_client names a counter's samples "<family>_total" even where the page did not:
    # Prometheus sends the name as the page wrote it.
    written = {m.group(0) for line in text.splitlines() if (m := _NAME.match(line)) is not None}
    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name if sample.name in written else family.name
            labels = dict(target_labels or {}) | dict(sample.labels) | {"__name__": name}
            series.append(Series(labels, [(ts_ms, float(sample.value))]))
    return series
