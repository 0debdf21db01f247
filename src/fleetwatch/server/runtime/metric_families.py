"""Every metric family the server puts on ``/metrics``, and where each is made.

Counted as things happen, on the registry each app builds (:class:`ServerMetrics`)::

    fleetwatch_ingest_batches_total{outcome}         fleetwatch_ingest_samples_total
    fleetwatch_ingest_events_total                   fleetwatch_ingest_rejections_total{status}
    fleetwatch_ingest_request_duration_seconds       fleetwatch_background_item_errors_total{job}
    fleetwatch_background_job_failures_total{job}    fleetwatch_background_runs_total{job}
    fleetwatch_background_pass_seconds{job}          fleetwatch_leader{role}
    fleetwatch_ingest_group_batches                  fleetwatch_ingest_group_left_out_total
    fleetwatch_fleet_snapshots_total{outcome}        fleetwatch_urgent_fresh_reads_total
    fleetwatch_background_gave_way_seconds_total
    fleetwatch_http_connections_closed_total{reason} fleetwatch_http_connections_open
    fleetwatch_http_requests_aborted_total{route}
    fleetwatch_metrics_render_seconds{page}
    fleetwatch_metrics_render_cpu_seconds_total{page}
    fleetwatch_remote_write_requests_total{status}   fleetwatch_remote_write_series_total{outcome}
    fleetwatch_remote_write_samples_total{outcome}

Set by the leader's retention pass (``upkeep/retention.py``)::

    fleetwatch_retention_rows_deleted_total{table}
    fleetwatch_retention_partitions_dropped_total{table}
    fleetwatch_retention_cutoff_timestamp_seconds{table}
    fleetwatch_partitions_created_total{table}       fleetwatch_partitions{table}
    fleetwatch_partition_default_rows{table}         fleetwatch_retention_last_run_timestamp_seconds
    fleetwatch_retention_pass_duration_seconds

Read at scrape time, on the same registry: ``fleetwatch_storage_*`` (``db/storage.py``,
``StorageCollector``). The registry is on the default page only (``metrics/pages.py``). Rendered
per scrape as text, after the registry's families, on the default page (D) or a shard (S):

- node state and the fleet's event counts (D), node labels and per-node/per-GPU event counts (S):
  ``metrics/exposition.py``;
- per GPU (S): ``metrics/gpu_exposition.py``, the GPU families named in
  :data:`fleetwatch.metrics.GPU_METRICS` (the dashboards read the same table);
- risk and verdicts per node and fleet (D), per GPU (S): ``metrics/risk_exposition.py``;
- step-time slowdown ratios (D) and slowness scores (S): ``metrics/straggler_exposition.py``;
- evictions and the drain budget (D): ``metrics/eviction_exposition.py``;
- availability, downtime, MTBF/MTTR, jobs, goodput and SLA over the last 7 days, fleet-wide
  (D): ``metrics/availability_exposition.py``;
- network adapter ports: fleet counts by state, degraded ports and the nodes with a port down or
  degraded (D), each port's state, rate and error counters (S): ``metrics/port_exposition.py``;
  host errors by kind and severity (D fleet-wide, S per node): ``metrics/exposition.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ServerMetrics"]


class ServerMetrics:
    """The service's own counters, on a registry the app owns."""

    def count_group(self, batches: int, grouped: int) -> None:
        """One group transaction of ``batches`` pushes, ``grouped`` of them stored in it."""
        self.ingest_group_batches.observe(batches)
        if batches > grouped:
            self.ingest_group_left_out.inc(batches - grouped)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ingest_batches = Counter(
            "fleetwatch_ingest_batches_total",
            "Ingest requests by outcome (accepted, duplicate, rejected).",
            ["outcome"],
            registry=registry,
        )
        self.ingest_samples = Counter(
            "fleetwatch_ingest_samples_total", "GPU samples stored.", registry=registry
        )
        self.ingest_events = Counter(
            "fleetwatch_ingest_events_total", "Events stored.", registry=registry
        )
        self.ingest_rejections = Counter(
            "fleetwatch_ingest_rejections_total",
            "Rejected ingest requests by HTTP status.",
            ["status"],
            registry=registry,
        )
        # Prometheus remote write (routers/remote_write.py, upkeep/remote_write_seal.py).
        self.remote_write_requests = Counter(
            "fleetwatch_remote_write_requests_total",
            "Remote-write requests by HTTP status answered.",
            ["status"],
            registry=registry,
        )
        self.remote_write_series = Counter(
            "fleetwatch_remote_write_series_total",
            "Remote-write series by outcome: used, unused (no FleetWatch reading is made from "
            "it), no_node (no node label).",
            ["outcome"],
            registry=registry,
        )
        self.remote_write_samples = Counter(
            "fleetwatch_remote_write_samples_total",
            "Remote-write sample fields by outcome: staged, stored (sealed into samples), "
            "duplicate, replica_dropped (the other HA replica), too_old, invalid, conflict, "
            "unused.",
            ["outcome"],
            registry=registry,
        )
        # Group commit (server/ingest/group_writer.py, PostgreSQL): how many pushes shared a
        # transaction, and how many a group left to be stored alone (new nodes, reboots, ...).
        self.ingest_group_batches = Histogram(
            "fleetwatch_ingest_group_batches",
            "Routine pushes per group transaction (PostgreSQL group commit).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=registry,
        )
        self.ingest_group_left_out = Counter(
            "fleetwatch_ingest_group_left_out_total",
            "Pushes a group left to be stored on their own (not routine, or the group failed).",
            registry=registry,
        )
        # How long /metrics took to build (before compression), and how much of that the
        # rendering thread ran: a slow page with little CPU waited (for the interpreter, a core
        # or the database), one with much CPU was work.
        self.metrics_render_seconds = Histogram(
            "fleetwatch_metrics_render_seconds",
            "Time to build one /metrics page (page: default or shard), before compression.",
            ["page"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )
        self.metrics_render_cpu = Counter(
            "fleetwatch_metrics_render_cpu_seconds",
            "CPU time of the threads that built /metrics pages (page: default or shard).",
            ["page"],
            registry=registry,
        )
        self.ingest_latency = Histogram(
            "fleetwatch_ingest_request_duration_seconds",
            "Time to validate and commit one ingest request.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        # A background job isolates a bad item (one node, GPU, alert, delivery) and carries on;
        # a whole pass failing is retried at the next tick. Both are counted, by job.
        self.background_item_errors = Counter(
            "fleetwatch_background_item_errors_total",
            "Items a background pass skipped because they failed (the rest carried on), by job.",
            ["job"],
            registry=registry,
        )
        self.background_job_failures = Counter(
            "fleetwatch_background_job_failures_total",
            "Background passes that failed as a whole (retried at the next tick), by job.",
            ["job"],
            registry=registry,
        )
        # Passes on the job's own timer (a wake-up's assessment, plan and alerts count under
        # "assessment"): on a replica that is not the leader only the assessment runs.
        # One judgement of the fleet for every process (server/judge/snapshot_sharing.py):
        # published by the leader, adopted by the others, refused when unreadable.
        self.fleet_snapshots = Counter(
            "fleetwatch_fleet_snapshots_total",
            "Whole-fleet assessments shared between processes: published (by the leader), "
            "adopted (instead of judging here) or refused (unreadable here); repaired counts "
            "those published with a verdict msgpack could not hold clamped (logged).",
            ["outcome"],
            registry=registry,
        )
        self.background_gave_way_seconds = Counter(
            "fleetwatch_background_gave_way_seconds",
            "Seconds the whole-fleet passes (assessment, rollups, lifecycle, snapshot) waited "
            "for this process's urgent lane or a /metrics page to finish "
            "(server/runtime/precedence.py).",
            registry=registry,
        )
        self.urgent_fresh_reads = Counter(
            "fleetwatch_urgent_fresh_reads_total",
            "Urgent passes that read their nodes' sample windows from the database because a "
            "whole-fleet assessment held the fleet's windows (instead of waiting for it).",
            registry=registry,
        )
        self.background_runs = Counter(
            "fleetwatch_background_runs_total",
            "Background passes completed on the job's timer or a wake-up, by job.",
            ["job"],
            registry=registry,
        )
        # Whether each pass fits well inside its interval at fleet scale (issue 12): an
        # assessment creeping towards its 30 s timer shows here before it starts to lag.
        self.background_pass_seconds = Histogram(
            "fleetwatch_background_pass_seconds",
            "Wall time of each completed background pass, by job.",
            ["job"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
            registry=registry,
        )
        self.leader = Gauge(
            "fleetwatch_leader",
            "1 while this process is the leader that runs the write jobs, else 0",
            ["role"],
            registry=registry,
        )
        # Connections this process closed or refused to stay within its limits, those it holds,
        # and requests whose client left before sending the whole body (server/http_guard.py).
        self.http_connections_closed = Counter(
            "fleetwatch_http_connections_closed_total",
            "Connections closed by this process: header_timeout (its request's head did not "
            "arrive in time), body_timeout (nor its body), idle (kept alive with no request), "
            "limit (refused with 503: the process held http_max_connections).",
            ["reason"],
            registry=registry,
        )
        for reason in ("header_timeout", "body_timeout", "idle", "limit"):
            self.http_connections_closed.labels(reason)
        self.http_connections_open = Gauge(
            "fleetwatch_http_connections_open",
            "Client connections this process holds now (at most http_max_connections).",
            registry=registry,
        )
        self.http_requests_aborted = Counter(
            "fleetwatch_http_requests_aborted_total",
            "Requests whose client closed the connection before sending the whole body (an "
            "upload aborted or cut at the body timeout), by route.",
            ["route"],
            registry=registry,
        )

        # The storage lifecycle: what the retention pass deleted, dropped and created.
        self.retention_rows_deleted = Counter(
            "fleetwatch_retention_rows_deleted_total",
            "Rows deleted because they were older than their table's retention, by table (rows "
            "of dropped partitions are not counted here: see the partitions dropped).",
            ["table"],
            registry=registry,
        )
        self.retention_partitions_dropped = Counter(
            "fleetwatch_retention_partitions_dropped_total",
            "Day partitions dropped whole because the whole day was past retention (PostgreSQL).",
            ["table"],
            registry=registry,
        )
        self.partitions_created = Counter(
            "fleetwatch_partitions_created_total",
            "Day partitions created, ahead of time or for rows that arrived in the DEFAULT one.",
            ["table"],
            registry=registry,
        )
        self.partitions = Gauge(
            "fleetwatch_partitions",
            "Partitions of the table after the last retention pass, DEFAULT included (PostgreSQL).",
            ["table"],
            registry=registry,
        )
        self.partition_default_rows = Gauge(
            "fleetwatch_partition_default_rows",
            "Rows left in the table's DEFAULT partition after the last retention pass: rows no "
            "day partition covers (PostgreSQL; normally 0).",
            ["table"],
            registry=registry,
        )
        self.retention_cutoff = Gauge(
            "fleetwatch_retention_cutoff_timestamp_seconds",
            "Rows of the table older than this were due for deletion at the last retention pass.",
            ["table"],
            registry=registry,
        )
        self.retention_last_run = Gauge(
            "fleetwatch_retention_last_run_timestamp_seconds",
            "When the last retention pass completed (Unix time).",
            registry=registry,
        )
        self.retention_duration = Gauge(
            "fleetwatch_retention_pass_duration_seconds",
            "How long the last retention pass took.",
            registry=registry,
        )

    def track_leader(self, role: str, leading: Callable[[], bool]) -> None:
        """``fleetwatch_leader{role}`` reads ``leading()`` at each scrape."""
        self.leader.labels(role=role).set_function(lambda: 1.0 if leading() else 0.0)
