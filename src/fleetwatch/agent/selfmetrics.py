"""The agent's own health, on a registry it owns (served when ``metrics_port`` is set)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["AgentMetrics"]


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.collector_errors = Counter(
            "fleetwatch_agent_collector_errors_total",
            "Collector failures by collector and reason.",
            ["collector", "reason"],
            registry=r,
        )
        self.collect_duration = Histogram(
            "fleetwatch_agent_collect_duration_seconds",
            "Time to run every collector once.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.spool_batches = Gauge(
            "fleetwatch_agent_spool_batches", "Batches waiting in the spool.", registry=r
        )
        self.spool_bytes = Gauge(
            "fleetwatch_agent_spool_bytes", "Bytes waiting in the spool.", registry=r
        )
        self.staged_ticks = Gauge(
            "fleetwatch_agent_staged_ticks",
            "Collections staged in the spool for the next push (push interval > interval).",
            registry=r,
        )
        self.spool_dropped = Counter(
            "fleetwatch_agent_spool_dropped_batches_total",
            "Batches dropped because the spool (its bound or its disk) was full.",
            registry=r,
        )
        self.pushed_batches = Counter(
            "fleetwatch_agent_pushed_batches_total", "Batches the server acknowledged.", registry=r
        )
        self.rejected_batches = Counter(
            "fleetwatch_agent_rejected_batches_total",
            "Batches the server refused for good (kept in the spool's rejected/ folder).",
            registry=r,
        )
        self.set_aside_batches = Counter(
            "fleetwatch_agent_set_aside_batches_total",
            "Batches the server kept failing on (500) while taking others, set aside into the "
            "spool's rejected/ folder and reported to the server.",
            registry=r,
        )
        self.push_failures = Counter(
            "fleetwatch_agent_push_failures_total",
            "Failed pushes by HTTP status or 'transport'.",
            ["reason"],
            registry=r,
        )
        self.push_latency = Histogram(
            "fleetwatch_agent_push_duration_seconds",
            "Time from sending a batch to the server's answer.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.last_push = Gauge(
            "fleetwatch_agent_last_push_success_timestamp_seconds",
            "Unix time of the last acknowledged push.",
            registry=r,
        )

    def observe_spool(self, batches: int, size: int) -> None:
        self.spool_batches.set(batches)
        self.spool_bytes.set(size)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
