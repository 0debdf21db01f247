"""The schema, declared once; Alembic revisions are checked against it in tests.

String lengths: a column that copies a wire field is as long as the wire allows (node names 253,
GPU UUIDs 124, label values 256, ...); a column whose value the server derives from several
(alert dedup keys, an observed location ``node/slot``) or whose length means nothing (a webhook
secret, possibly encrypted) is ``Text``. Nothing a client may send can then overflow a column
in a background job, which would fail that job for the whole fleet on PostgreSQL;
``tests/unit/server/db/test_column_lengths.py`` derives the bounds from the wire validation and
fails when a column falls short.

``gpu_sample_blocks`` holds the samples: one row per GPU per push, the ticks' fields compressed
(:mod:`fleetwatch.server.db.sample_blocks`, which lays them out from
:data:`fleetwatch.telemetry.SAMPLE_FIELDS`, so that the wire schema and the store cannot drift). It
is the one table that grows with the fleet, so its columns are chosen for size
(:mod:`fleetwatch.server.db.sample_columns`) and, on PostgreSQL, it is partitioned by day and
aged out whole (:mod:`fleetwatch.server.db.partitions`, :mod:`fleetwatch.server.upkeep.retention`).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from fleetwatch.server.db.base import BigId, Json, UtcDateTime, metadata

__all__ = [
    "api_tokens",
    "events",
    "gpu_lifetimes",
    "gpu_sample_blocks",
    "gpus",
    "ingest_batches",
    "node_boots",
    "node_ports",
    "nodes",
]

nodes = Table(
    "nodes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(253), nullable=False, unique=True),
    Column("labels", Json, nullable=False),
    Column("interval_s", Float, nullable=False),
    Column("agent_version", String(64)),
    Column("boot_id", String(64)),
    Column("first_seen", UtcDateTime, nullable=False),
    # Not indexed: every push updates it, and an index would keep the update from being HOT
    # (migration 0014); its readers want most of the fleet, which a scan answers as fast.
    Column("last_seen", UtcDateTime, nullable=False),
    # Seconds from its newest push's newest reading to the push's storing (the store's clock
    # minus the agent's; None: that push had no reading): server.concepts.ingest_lag.
    Column("lag_s", Float),
)

gpus = Table(
    "gpus",
    metadata,
    # A small key for the sample blocks to carry instead of the UUID (4 bytes a row instead of ~41).
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uuid", String(128), nullable=False, unique=True),
    Column("node_id", Integer, ForeignKey("nodes.id"), nullable=False, index=True),
    Column("index", Integer, nullable=False),
    Column("serial", String(64), index=True),
    Column("pci_bus_id", String(16)),
    Column("name", String(128)),
    Column("driver_version", String(64)),
    Column("vbios_version", String(64)),
    Column("first_seen", UtcDateTime, nullable=False),
    Column("last_seen", UtcDateTime, nullable=False),  # not indexed, as nodes.last_seen
    # The newest sample, denormalised so that /metrics and GET /v1/gpus never decode samples.
    Column("latest_ts", UtcDateTime),
    Column("latest", Json),
)


# Each boot of a node, numbered: a sample carries the number (4 bytes) instead of the boot id
# (up to 64 characters, ~37 for a Linux boot UUID). Rows are never changed nor deleted.
node_boots = Table(
    "node_boots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node_id", Integer, ForeignKey("nodes.id"), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("first_seen", UtcDateTime, nullable=False),
    UniqueConstraint("node_id", "boot_id"),
)


# Each network adapter port of a node as last read (wire ``PortSample``), with the per-second
# rates of its counters since the reading before. One row per (node, device, port), updated in
# place: port history is not kept (a node reads its ports as often as its GPUs; at ~45 counters
# a port, a history would outweigh the GPUs' samples).
node_ports = Table(
    "node_ports",
    metadata,
    Column("node_id", Integer, ForeignKey("nodes.id"), primary_key=True),
    Column("device", String(64), primary_key=True),
    Column("port", SmallInteger, primary_key=True),
    Column("ts", UtcDateTime, nullable=False),
    Column("boot_id", String(64)),
    Column("link_layer", String(32)),
    Column("node_guid", String(19)),
    Column("netdev", String(15)),
    Column("state", String(32)),
    Column("state_code", SmallInteger),
    Column("phys_state", String(32)),
    Column("phys_state_code", SmallInteger),
    Column("rate_gbps", Float),
    Column("link_width", SmallInteger),
    Column("link_speed", String(16)),
    Column("counters", Json),
    Column("hw_counters", Json),
    # {"counters": {name: {per_s, increase, reset}}, "hw_counters": {...}} since rates_since.
    Column("rates", Json),
    Column("rates_since", UtcDateTime),
    # What the port rules remember (rules.port_events): normal_rate_gbps, normal_width, degraded,
    # and the current error window's start (errors_from, errors_boot) and base counters.
    Column("health", Json),
)


# One row per GPU per push (:mod:`fleetwatch.server.db.sample_blocks`): the ticks of one GPU
# from one batch, at most an hour and 360 ticks, never across a UTC midnight, their fields
# compressed in ``data``. Columns widest first (PostgreSQL pads each to its alignment).
#
# On PostgreSQL the table is partitioned by ``ts0`` (RANGE, one partition a day plus a DEFAULT
# one; a block lies within its first tick's day) and its primary key is (id, ts0): a partitioned
# table's unique keys must include the partition key. ``id`` serves the readers that continue
# from the last block id they saw; ``(gpu_id, ts0)`` a GPU's history (its oldest block first);
# ``ts0`` has a BRIN index there (a few kilobytes: blocks arrive in roughly time order), a
# B-tree on SQLite, which has no BRIN.
gpu_sample_blocks = Table(
    "gpu_sample_blocks",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("ts0", UtcDateTime, nullable=False, comment="the block's first tick"),
    Column("ts1", UtcDateTime, nullable=False, comment="the block's last tick"),
    # No foreign keys: checking them per row would slow the bulk load; ingest checks GPUs once
    # per batch instead.
    Column("gpu_id", Integer, nullable=False, comment="gpus.id"),
    Column("node_id", Integer, nullable=False),
    Column("boot", Integer, comment="node_boots.id: the node's boot when sampled"),
    Column("n", SmallInteger, nullable=False, comment="ticks in the block"),
    Column("data", LargeBinary, nullable=False, comment="the ticks' fields, compressed"),
    Index("ix_gpu_sample_blocks_gpu_id_ts0", "gpu_id", "ts0"),
    Index("ix_gpu_sample_blocks_ts0", "ts0", postgresql_using="brin"),
    postgresql_partition_by="RANGE (ts0)",
)

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    # Null for fleet-wide events (a model's wear-out onset), which belong to no node.
    Column("node_id", Integer, ForeignKey("nodes.id")),
    Column("gpu_uuid", String(128)),
    Column("pci_bus_id", String(16)),
    Column("kind", String(64), nullable=False),
    Column("xid", Integer),
    Column("ts", UtcDateTime, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Column("message", Text),
    Column("pid", BigInteger),
    Column("process", String(256)),
    Column("details", Json),
    Column("batch_id", String(128)),
    Index("ix_events_ts", "ts"),
    Index("ix_events_kind_xid", "kind", "xid"),
    Index("ix_events_node_id_ts", "node_id", "ts"),
    Index("ix_events_gpu_uuid_ts", "gpu_uuid", "ts"),
)

gpu_lifetimes = Table(
    "gpu_lifetimes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # The serial, or the GPU UUID of a GPU that reports none (up to 124 characters).
    Column("serial", String(128), nullable=False, index=True),
    Column("gpu_uuid", String(128)),
    Column("node_id", Integer, ForeignKey("nodes.id")),
    Column("location", Text),  # node/slot when observed (266 at most), as given when imported
    Column("sku", String(128)),
    Column("installed_at", UtcDateTime, nullable=False),
    Column("removed_at", UtcDateTime),
    Column("end_kind", String(16), comment="failure | repair | retirement; null while in service"),
    Column("cause", Text),
    Column("evidence", Json),
    Column("source", String(16), nullable=False, comment="observed | operator | import"),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("token_id", String(16), nullable=False, unique=True, comment="public part of the token"),
    Column("name", String(128), nullable=False),
    Column("scope", String(16), nullable=False),
    Column("secret_sha256", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime),
    Column("last_used_at", UtcDateTime),
    Column(
        "node_pattern",
        String(253),
        comment="agent tokens: the nodes it may speak for (a name or shell pattern); null: any",
    ),
)

ingest_batches = Table(
    "ingest_batches",
    metadata,
    Column("batch_id", String(128), primary_key=True),
    Column("node_id", Integer, ForeignKey("nodes.id"), nullable=False),
    Column("received_at", UtcDateTime, nullable=False, index=True),
    Column("content_sha256", String(64), nullable=False),
    Column("samples", Integer, nullable=False),
    Column("events", Integer, nullable=False),
)


# One row per GPU and UTC hour of telemetry: the trailing-window covariates of the survival
# models read these instead of decoding samples (see fleetwatch.models.telemetry_features).
gpu_hourly = Table(
    "gpu_hourly",
    metadata,
    Column("gpu_uuid", String(128), primary_key=True),
    Column("hour", UtcDateTime, primary_key=True),
    Column("node_id", Integer, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("span_s", Float, nullable=False, comment="first to last sample"),
    Column("temp_p95_c", Float),
    Column("temp_max_c", Float),
    Column("throttle_reported", Integer, nullable=False, comment="samples with reasons"),
    Column("throttled", Integer, nullable=False, comment="of those, HW/thermal/power throttled"),
    Column("sbe_errors", Float, comment="increase of the aggregate SBE counter"),
    Column("nvlink_errors", Float, comment="increase of NVLink CRC + replay + recovery counters"),
    Column("pcie_replays", Float, comment="increase of the PCIe replay counter"),
    Column("remapped_rows", BigInteger, comment="correctable + uncorrectable, newest"),
    Column("xid_hardware", Integer, nullable=False),
    Column("xid_memory", Integer, nullable=False),
    Column("xid_interconnect", Integer, nullable=False),
    Column("xid_power_thermal", Integer, nullable=False),
    Column("xid_driver_firmware", Integer, nullable=False),
    Index("ix_gpu_hourly_hour", "hour"),
)

# A model version is one refit: the fleet and per-SKU Weibull fits and, when the data allows,
# the AFT model with covariates, with everything needed to score without lifelines.
risk_models = Table(
    "risk_models",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=True),
    Column("trained_at", UtcDateTime, nullable=False, index=True),
    Column("trigger", String(16), nullable=False, comment="schedule | manual | startup"),
    Column("status", String(16), nullable=False, comment="ok | failed | rejected"),
    Column("params", Json),
    Column("metrics", Json),
    Column("error", Text),
    # The held-out comparison with the version in service (server/upkeep/promotion.py).
    Column("evaluation", Json),
)

# --- Act: jobs' step times, stragglers, evictions -------------------------------------------

# Step times as training jobs report them (POST /v1/jobs/{job_id}/steps), one row per rank-step.
job_steps = Table(
    "job_steps",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("job_id", String(128), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("node", String(253), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("ts", UtcDateTime, nullable=False),
    Column("stage", Integer, comment="pipeline stage, when the job says"),
    Column("dp_group", Integer, comment="data-parallel group, when the job says"),
    Index("ix_job_steps_job_id_ts", "job_id", "ts"),
    Index("ix_job_steps_ts", "ts"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(128), primary_key=True),
    Column("first_seen", UtcDateTime, nullable=False),
    Column("last_seen", UtcDateTime, nullable=False, index=True),
    Column("ranks", Integer, nullable=False),
    Column("nodes", Json, nullable=False, comment="node names the job reported from"),
    # Issue 14: what the job says of its own start and end (POST /v1/jobs/{id}/start | end).
    Column("started_at", UtcDateTime),
    Column("ended_at", UtcDateTime),
    Column("outcome", String(16), comment="completed | failed | cancelled; null while running"),
    Column("end_reason", Text, comment="the job's own words on why it ended"),
    # Issue 15: the node risk at which the job wants a notice, and over what horizon.
    Column("notice_risk_threshold", Float, comment="P(failure) that opens a risk notice"),
    Column("notice_horizon_h", Float, comment="hours the risk notice looks ahead"),
)

# A checkpoint the job wrote (POST /v1/jobs/{id}/checkpoints); one per job and start time.
job_checkpoints = Table(
    "job_checkpoints",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("job_id", String(128), nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("step", BigInteger),
    UniqueConstraint("job_id", "started_at"),
    Index("ix_job_checkpoints_started_at", "started_at"),
)

# A restart of the job from a checkpoint (POST /v1/jobs/{id}/restarts); one per resume time.
job_restarts = Table(
    "job_restarts",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("job_id", String(128), nullable=False),
    Column("resumed_at", UtcDateTime, nullable=False),
    Column("interrupted_at", UtcDateTime, comment="when the job stopped, if it says"),
    Column("from_step", BigInteger),
    Column("lost_steps", BigInteger, comment="steps done since the checkpoint, redone"),
    Column("lost_s", Float, comment="seconds of work redone, if the job says"),
    UniqueConstraint("job_id", "resumed_at"),
    Index("ix_job_restarts_resumed_at", "resumed_at"),
)

# Issue 15: what the server tells a running job about its nodes (GET /v1/jobs/{id}/notices).
# One row per notice; ``id`` is the job's cursor (``?after=<id>``). A notice that no longer holds
# gets ``cleared_at`` and a ``cleared`` row of its own (pointing back through ``clears``), so a
# rank that reconnects reads both, in order.
job_notices = Table(
    "job_notices",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("job_id", String(128), nullable=False),
    Column("kind", String(16), nullable=False, comment="drain_pending | gpu_out | risk | cleared"),
    Column("node", String(253), nullable=False),
    Column("gpu", String(124), comment="GPU UUID, when the notice is about one GPU"),
    Column("reason", Text, nullable=False),
    Column("evidence", Json),
    Column(
        "action",
        String(32),
        nullable=False,
        comment="checkpoint_now | checkpoint_and_exit | continue",
    ),
    Column("opened_at", UtcDateTime, nullable=False),
    Column("cleared_at", UtcDateTime, comment="set when the notice no longer holds"),
    Column("clears", BigInteger, comment="for a cleared notice: the id of the notice it clears"),
    Index("ix_job_notices_job_id_id", "job_id", "id"),
    Index("ix_job_notices_cleared_at", "cleared_at"),
)

# A node's straggler verdict within one job; open while the node is slow (ended_at null).
stragglers = Table(
    "stragglers",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(128), nullable=False),
    Column("node", String(253), nullable=False),
    Column("kind", String(16), nullable=False, comment="hardware | workload"),
    Column("started_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime),
    Column("windows", Integer, nullable=False, comment="consecutive slow windows"),
    Column("ratio", Float, nullable=False, comment="node median step / job median step"),
    Column("evidence", Json),
    Index("ix_stragglers_job_id_node", "job_id", "node"),
    Index("ix_stragglers_node_ended_at", "node", "ended_at"),
)

# Persistent slowness of a node across jobs (an exponentially weighted ratio).
node_slowness = Table(
    "node_slowness",
    metadata,
    Column("node", String(253), primary_key=True),
    Column("score", Float, nullable=False, comment="EWMA of the node's step-time ratio"),
    Column("windows", Integer, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

# Per job, the straggler detector after the windows judged so far, written with their verdicts:
# whichever worker judges the job next continues from here (it never replays judged windows).
straggler_state = Table(
    "straggler_state",
    metadata,
    Column("job_id", String(128), primary_key=True),
    Column("next_start", UtcDateTime, nullable=False, comment="the first window not judged yet"),
    Column("detector", Json, nullable=False, comment="window index, runs and ratios per node"),
    Column("ratios", Json, nullable=False, comment="node ratios of the newest judged window"),
    Column("updated_at", UtcDateTime, nullable=False),
)

# A recommendation to drain a node, and its life: pending -> acked -> completed -> returned,
# or rejected / cancelled; "paged" when the fleet drain budget was exhausted.
evictions = Table(
    "evictions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(253), nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason_kind", String(16), nullable=False, comment="rule | risk | straggler"),
    Column("reason", Text, nullable=False),
    Column("evidence", Json),
    Column("expected_saving_usd", Float),
    Column("dry_run", Boolean, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("claimed_by", String(128)),
    Column("lease_expires_at", UtcDateTime),
    Column("completed_at", UtcDateTime),
    Column("returned_at", UtcDateTime),
    Column("detail", Text, comment="rejection reason or return note"),
    Column(
        "repeat_of",
        Integer,
        comment="a hardware eviction within repeat_offender_days of this node's last "
        "return: the eviction it returned from",
    ),
    Index("ix_evictions_state", "state"),
    Index("ix_evictions_node_state", "node", "state"),
)

# Every state change of an eviction, who made it and why.
eviction_audit = Table(
    "eviction_audit",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("eviction_id", Integer, ForeignKey("evictions.id"), nullable=False, index=True),
    Column("node", String(253), nullable=False),
    Column("ts", UtcDateTime, nullable=False, index=True),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("actor", String(128), nullable=False, comment="planner, or the token name"),
    Column("detail", Json),
)

# One `fleetwatch validate` run pushed by a node: the return-to-service gate reads the newest
# passing one (server/repo/validations.py). received_at is the server's clock, so "newer than the
# eviction" never depends on the node's.
node_validations = Table(
    "node_validations",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("node", String(253), nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=False, comment="the node's clock"),
    Column("finished_at", UtcDateTime, nullable=False, comment="the node's clock"),
    Column("passed", Boolean, nullable=False),
    Column("failed", Json, nullable=False, comment="labels of the failed checks"),
    Column("checks", Json, nullable=False),
    Column("tools", Json, nullable=False, comment="fleetwatch, driver, dcgm versions"),
    Column("dcgm_level", SmallInteger),
    Column("duration_s", Float, nullable=False),
    Column("pushed_by", String(128), nullable=False, comment="the token name"),
    Index("ix_node_validations_node_received", "node", "received_at"),
)

# --- Tell: alerts and their delivery to on-call ----------------------------------------------

# Where alerts go: a generic signed JSON webhook, Slack, PagerDuty Events v2 or Alertmanager.
webhook_subscriptions = Table(
    "webhook_subscriptions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("kind", String(16), nullable=False, comment="generic|slack|pagerduty|alertmanager"),
    Column("url", Text, nullable=False),
    # The HMAC key must be readable to sign with; it is never returned by the API.
    Column("secret", Text, comment="HMAC-SHA256 key (generic) or routing key (pagerduty)"),
    Column("filters", Json, nullable=False, comment="min_severity, clusters, kinds, weekly_report"),
    Column("enabled", Boolean, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
)

# One alert per condition (dedup key), firing until its verdict clears, then resolved.
alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dedup_key", Text, nullable=False),  # derived: a node name alone may be 253 long
    Column("state", String(16), nullable=False, comment="firing | resolved"),
    Column("kind", String(32), nullable=False, comment="verdict | unreachable | straggler | ..."),
    Column("severity", String(16), nullable=False),
    Column("node", String(253)),
    Column("gpu_uuid", String(128)),
    Column("serial", String(64)),
    Column("slot", String(64)),
    Column("cluster", String(256)),  # the node's label "cluster", up to 256 at ingest
    Column("summary", Text, nullable=False),
    Column("action", String(32)),
    Column("evidence", Json),
    Column("occurrences", Integer, nullable=False, comment="times seen while firing (floods)"),
    Column("started_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("resolved_at", UtcDateTime),
    Index("ix_alerts_dedup_key_state", "dedup_key", "state"),
    Index("ix_alerts_state", "state"),
)

# The durable outbox: a delivery survives restarts and is retried with backoff until it lands.
webhook_outbox = Table(
    "webhook_outbox",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("subscription_id", Integer, ForeignKey("webhook_subscriptions.id"), nullable=False),
    Column("alert_id", Integer, ForeignKey("alerts.id")),
    Column("event", String(16), nullable=False, comment="trigger | resolve | report"),
    Column("idempotency_key", String(256), nullable=False, unique=True),
    Column("payload", Json, nullable=False),
    Column("state", String(16), nullable=False, comment="pending | delivered | dead"),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UtcDateTime, nullable=False),
    Column("last_error", Text),
    Column("created_at", UtcDateTime, nullable=False),
    Column("delivered_at", UtcDateTime),
    Index("ix_webhook_outbox_state_next_attempt_at", "state", "next_attempt_at"),
)

# --- Leader: what a background job remembers between passes -----------------------------------

# One row per job (the planner's risk streaks and budget episode, the rollups' newest sample id),
# written in the transaction of the pass that changed it: a new leader continues from it.
leader_state = Table(
    "leader_state",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value", Json, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

# --- The leader's fleet assessment, shared with the other processes ----------------------------

# One row per shared snapshot (one today: ``fleet``), replaced after each whole-fleet pass of the
# leader: the other processes adopt it instead of judging 100,000 GPUs each
# (server.judge.snapshot_sharing). ``published_at`` is the database's clock, so a follower on
# another host judges its age without trusting its own.
fleet_snapshots = Table(
    "fleet_snapshots",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("seq", BigInteger, nullable=False, comment="one more on each publication"),
    Column("format", SmallInteger, nullable=False, comment="the body's encoding version"),
    Column("whole_at", UtcDateTime, nullable=False, comment="when the whole fleet was judged"),
    Column("published_at", UtcDateTime, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("body", LargeBinary, nullable=False, comment="zlib-compressed msgpack"),
)

# --- Maintenance: planned downtime ------------------------------------------------------------

# A window of planned downtime over named nodes or a label selector: silence, reboots and resets
# inside it are no fault (server.repo.maintenance). Rows are never deleted: ending one (the API's
# DELETE, an adapter whose reservation went away) sets ended_at, so the table is its own audit.
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("nodes", Json, comment="node names; null when a selector names the nodes"),
    Column("selector", Json, comment="label -> value, all must match; null when nodes are named"),
    Column("starts_at", UtcDateTime, nullable=False),
    Column("ends_at", UtcDateTime, comment="null: until ended"),
    Column("reason", Text, nullable=False),
    Column("key", Text, comment="an adapter's own id for it, e.g. slurm:<reservation>"),
    Column("created_by", String(128), nullable=False, comment="the token name"),
    Column("created_at", UtcDateTime, nullable=False),
    Column("ended_at", UtcDateTime, comment="when it was ended early (or called off)"),
    Column("ended_by", String(128)),
    Index("ix_maintenance_windows_ended_at", "ended_at"),
)


# Prometheus remote write (issue 38, server/ingest/remote_write_store.py). Prometheus splits a
# scrape across requests and shards: the pieces of one GPU's (or port's) reading at one instant
# wait here until the scrape is complete, then become one sample. The row stays, with the
# fields stored as a bit mask, for as long as Prometheus may resend them, so that a resent
# piece is stored once.
remote_write_staging = Table(
    "remote_write_staging",
    metadata,
    # A GPU's UUID, or "port:<node>:<device>:<port>" for a node_exporter port reading.
    Column("key", String(400), primary_key=True),
    Column("ts", UtcDateTime, primary_key=True),
    Column("node", String(253), nullable=False),
    Column("identity", Json, nullable=False),
    Column("pending", Json, comment="fields waiting to be stored; null: none"),
    Column("stored_mask", BigInteger, nullable=False, comment="fields stored, one bit each"),
    # When its last piece came; null once nothing is pending (the sealer reads only the others).
    Column("received_at", UtcDateTime),
    Index("ix_remote_write_staging_received_at", "received_at"),
    Index("ix_remote_write_staging_ts", "ts"),
)

# The last value seen of a series whose change is an event (a GPU's last Xid code, an EDAC
# counter): the next value is compared with it.
remote_write_state = Table(
    "remote_write_state",
    metadata,
    Column("key", String(400), primary_key=True),
    Column("value", BigInteger, nullable=False),
    Column("ts", UtcDateTime, nullable=False),
)

# An HA pair of Prometheus servers sends every series twice: the replica stored per cluster.
remote_write_replicas = Table(
    "remote_write_replicas",
    metadata,
    Column("cluster", String(256), primary_key=True),
    Column("replica", String(256), nullable=False),
    Column("last_seen", UtcDateTime, nullable=False),
)
