"""Settings for the server and the agent, from flags, environment and defaults.

Settings are built only by ``load_server_settings()`` (called from the CLI or ``create_app``) and
``load_agent_settings()``; tests construct them directly. Every knob has a description and a group
(operator, fleet policy, advanced), which ``fleetwatch config show`` prints and from which
``fleetwatch config docs`` writes docs/configuration.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from fleetwatch.client_tls import (
    CA_BUNDLE_ENV,
    CLIENT_CERT_ENV,
    CLIENT_KEY_ENV,
    ClientTls,
    is_loopback_url,
)
from fleetwatch.errors import ConfigError

__all__ = [
    "SETTING_GROUPS",
    "AgentSettings",
    "ServerSettings",
    "SettingGroup",
    "env_var",
    "load_agent_settings",
    "load_server_settings",
    "setting_group",
]

# The hourly rollups recompute up to 7 days back; raw samples must outlive that by a margin.
MIN_RAW_RETENTION_DAYS = 8.0

SettingGroup = Literal["operator", "fleet policy", "advanced"]
# In the order `fleetwatch config show` and docs/configuration.md list them.
SETTING_GROUPS: tuple[SettingGroup, ...] = ("operator", "fleet policy", "advanced")
# Each field names its group in its own metadata (json_schema_extra), so a setting added without
# one fails tests/unit/test_config_groups.py instead of landing in no group.
# operator: what someone deploying FleetWatch must or commonly sets.
OPERATOR: JsonDict = {"group": "operator"}
# fleet policy: how the fleet is judged and acted on (thresholds, budgets, horizons, alerting).
FLEET_POLICY: JsonDict = {"group": "fleet policy"}
# advanced: internal tuning (limits, caches, pools, intervals of internal passes, GC, malloc).
ADVANCED: JsonDict = {"group": "advanced"}
# A field whose default is computed where it runs (the hostname) says what it is under
# "default_shown", so that docs/configuration.md is the same on every machine.


def setting_group(settings: type[BaseSettings], name: str) -> SettingGroup:
    """The group a settings field declares; a ValueError names a field that declares none."""
    extra = settings.model_fields[name].json_schema_extra
    group = extra.get("group") if isinstance(extra, dict) else None
    for known in SETTING_GROUPS:
        if group == known:
            return known
    raise ValueError(f"{settings.__name__}.{name} names no setting group ({group!r})")


class ServerSettings(BaseSettings):
    """The central service. Environment: ``FLEETWATCH_SERVER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="FLEETWATCH_SERVER_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///fleetwatch.db",
        description="SQLAlchemy URL: sqlite:///path.db (embedded) or postgresql://user@host/db",
        json_schema_extra=OPERATOR,
    )
    host: str = Field(
        default="127.0.0.1", description="Address to listen on", json_schema_extra=OPERATOR
    )
    port: int = Field(
        default=8400, ge=1, le=65535, description="Port to listen on", json_schema_extra=OPERATOR
    )
    workers: int = Field(
        default=1, ge=1, le=64, description="Worker processes (uvicorn)", json_schema_extra=OPERATOR
    )
    role: Literal["api", "worker", "all"] = Field(
        default="all",
        description="api: serve requests (and keep a read-only assessment fresh); worker or all: "
        "also compete to be the one leader that runs the write jobs (PostgreSQL for more than one)",
        json_schema_extra=OPERATOR,
    )
    insecure_no_auth: bool = Field(
        default=False,
        description="Accept requests without a token, as admin. Local experiments only.",
        json_schema_extra=OPERATOR,
    )
    tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate chain to serve HTTPS with (TLS 1.2 or newer), this server's "
        "certificate first; re-read without a restart when it changes (cert-manager renewals)",
        json_schema_extra=OPERATOR,
    )
    tls_key: Path | None = Field(
        default=None,
        description="PEM private key of tls_cert; re-read with it",
        json_schema_extra=OPERATOR,
    )
    tls_client_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle that client certificates must chain to: set, every client must "
        "present one (mutual TLS) besides its bearer token, and a push, validation or job event "
        "must name a node its certificate names (subject CN or a DNS SAN); re-read with tls_cert",
        json_schema_extra=OPERATOR,
    )
    tls_reload_check_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="How often, at most, a new TLS connection checks whether the certificate, "
        "key or client CA files changed (one stat() of each); a changed set is loaded for that "
        "connection and every later one",
        json_schema_extra=ADVANCED,
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest ingest body, after decompression",
        json_schema_extra=ADVANCED,
    )
    max_gpus_per_batch: int = Field(
        default=1024, ge=1, description="Most GPUs in one batch", json_schema_extra=ADVANCED
    )
    max_samples_per_batch: int = Field(
        default=50_000, ge=1, description="Most samples in one batch", json_schema_extra=ADVANCED
    )
    max_events_per_batch: int = Field(
        default=10_000, ge=1, description="Most events in one batch", json_schema_extra=ADVANCED
    )
    max_future_skew_s: float = Field(
        default=300.0,
        ge=0,
        description="How far in the future a timestamp may be (clock skew)",
        json_schema_extra=ADVANCED,
    )
    max_past_age_s: float = Field(
        default=30 * 86400.0,
        gt=0,
        description="How old a sample or event may be when it arrives (an agent's spool keeps "
        "days of outage; older means a wrong clock): 30 days",
        json_schema_extra=ADVANCED,
    )
    remote_write_node_labels: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["Hostname", "instance"],
        description="Prometheus remote write: the labels that name a series' node, "
        "comma-separated, the first present wins (dcgm-exporter's Hostname; node, "
        "kubernetes_node or instance where Kubernetes relabels); an instance's :port is dropped",
        json_schema_extra=OPERATOR,
    )
    remote_write_scrape_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Prometheus remote write: the scrape interval of the dcgm-exporter job, the "
        "interval a node is judged silent by (unreachable after unreachable_after_intervals of "
        "them)",
        json_schema_extra=FLEET_POLICY,
    )
    remote_write_settle_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Prometheus remote write: how long after the last piece of a GPU's scrape "
        "its readings are stored as one sample (Prometheus splits a scrape across requests and "
        "shards, each sent within batch_send_deadline, 5 s by default)",
        json_schema_extra=ADVANCED,
    )
    remote_write_dedup_window_s: float = Field(
        default=6 * 3600.0,
        ge=60,
        description="Prometheus remote write: how long what was stored is remembered, so a "
        "resent sample is stored once; an older sample is refused (counted, not stored). "
        "Prometheus' WAL holds about 2 hours",
        json_schema_extra=ADVANCED,
    )
    remote_write_ha_cluster_label: str = Field(
        default="cluster",
        min_length=1,
        description="Prometheus remote write from an HA pair: the external label naming the "
        "pair (Cortex's and Mimir's convention)",
        json_schema_extra=ADVANCED,
    )
    remote_write_ha_replica_label: str = Field(
        default="__replica__",
        min_length=1,
        description="Prometheus remote write from an HA pair: the external label naming the "
        "replica; only one replica per cluster is stored",
        json_schema_extra=ADVANCED,
    )
    remote_write_ha_failover_s: float = Field(
        default=30.0,
        gt=0,
        description="Prometheus remote write from an HA pair: silence of the stored replica "
        "after which the other one is stored instead",
        json_schema_extra=ADVANCED,
    )
    unreachable_after_intervals: float = Field(
        default=3.0,
        gt=1,
        description="A node is unreachable after this many silent intervals",
        json_schema_extra=FLEET_POLICY,
    )
    unreachable_lag_grace_max_s: float = Field(
        default=3600.0,
        ge=0,
        description="While the fleet's pushes are stored late (the server behind on ingest), "
        "every unreachable deadline moves out by that lag (the median over the nodes heard in the "
        "last 10 minutes), at most this many seconds: a late push is not a silent node; 0 = off",
        json_schema_extra=FLEET_POLICY,
    )
    token_cache_ttl_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long a verified bearer token is remembered (no query per request). A "
        "token revoked through another server process or the CLI is refused within this many "
        "seconds (through this one: at once); 0 checks the database on every request",
        json_schema_extra=ADVANCED,
    )
    metrics_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="How stale /metrics' cache of latest GPU state may be",
        json_schema_extra=ADVANCED,
    )
    metrics_require_token: bool = Field(
        default=True,
        description="/metrics needs a bearer token with read scope",
        json_schema_extra=OPERATOR,
    )
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="PostgreSQL connections per worker, and as many again on demand; with the "
        "40 request threads this avoids opening new connections under load",
        json_schema_extra=ADVANCED,
    )
    max_concurrent_ingest: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Ingest transactions at once per worker; more wait their turn, which costs "
        "less than many threads contending for one interpreter lock and the database",
        json_schema_extra=ADVANCED,
    )
    log_accepted_pushes: bool = Field(
        default=False,
        description="Write an access-log line for each push that POST /v1/ingest accepted "
        "(200). Off by default: a 12,500-node fleet pushes about 200 times a second, and "
        "fleetwatch_ingest_batches_total counts them; refused pushes, every other request and "
        "every error are logged either way",
        json_schema_extra=OPERATOR,
    )
    # Each connection holds a file descriptor until it closes, and uvicorn alone waits as long as
    # a client likes for a request's head or body: some 20,000 silent connections (the open-file
    # limit) stopped a server answering anyone, without a line in its log. The limits below are
    # per server process (server/http_guard.py); each close or refusal is counted in
    # fleetwatch_http_connections_closed_total{reason} and said in at most one line a minute.
    http_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's line and headers must have arrived this many seconds after its "
        "connection opened (or, on a kept-alive connection, after its first byte), else the "
        "connection is closed: an agent sends them in one packet, a silent client holds a "
        "connection for nothing",
        json_schema_extra=ADVANCED,
    )
    http_body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A request's body must have arrived this many seconds after its headers, else "
        "the connection is closed: the largest push (max_body_bytes, 8 MiB) needs 140 KB/s; a "
        "body trickling in byte by byte holds a connection as long as it likes otherwise",
        json_schema_extra=ADVANCED,
    )
    http_idle_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="A kept-alive connection with no request for this many seconds is closed "
        "(uvicorn's keep-alive timeout; agents push once a minute and reconnect)",
        json_schema_extra=ADVANCED,
    )
    http_max_connections: int = Field(
        default=4096,
        ge=1,
        description="Connections one server process holds at once; one more is answered 503 and "
        "closed at once. Lowered to 256 short of the process's open-file limit if that is lower, "
        "so the database, the log and a refusal still find a descriptor. A 12,500-node fleet "
        "pushing once a minute holds about 1,000 across the processes (200 pushes a second, "
        "each connection kept 5 s after its answer; arithmetic, not a measurement)",
        json_schema_extra=ADVANCED,
    )
    gc_gen0_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Allocations between the interpreter's youngest garbage collections in a "
        "server process (Python's default is 700); 0 leaves Python's own settings. A server "
        "holding a large fleet's snapshot spends a quarter of a second on each full collection, "
        "and the default makes them frequent",
        json_schema_extra=ADVANCED,
    )
    malloc_arenas: int = Field(
        default=2,
        ge=0,
        description="glibc malloc arenas in a server process (glibc's default is 8 per core, "
        "one per thread up to that): fewer arenas hold less freed memory (peak RSS 2.61 -> 2.02 "
        "GiB at 100,000 GPUs, same CPU); 0 leaves glibc's default, and an operator's own "
        "MALLOC_ARENA_MAX wins",
        json_schema_extra=ADVANCED,
    )
    malloc_mmap_threshold_kb: int = Field(
        default=256,
        ge=0,
        le=32 * 1024,
        description="Allocations of at least this many KiB in a server process get a memory "
        "mapping of their own, returned to the system when freed (glibc's threshold starts at "
        "128 KiB and grows with each large block freed, up to 32 MiB, after which NumPy's "
        "arrays fragment the heaps); 0 leaves glibc's default, and an operator's own "
        "MALLOC_MMAP_THRESHOLD_ wins",
        json_schema_extra=ADVANCED,
    )
    ingest_group_max_batches: int = Field(
        default=64,
        ge=0,
        le=1024,
        description="PostgreSQL: routine pushes (known node and GPUs, samples only) waiting at "
        "one moment are stored in one transaction, up to this many; 0 stores each push alone",
        json_schema_extra=ADVANCED,
    )
    ingest_group_linger_ms: float = Field(
        default=250.0,
        ge=0,
        le=1000,
        description="PostgreSQL: how long a group of routine pushes waits for more before it is "
        "stored (pushes with events never wait); 0 stores what is queued at once. A routine push "
        "comes once a minute and nothing waits on its answer; at 100,000 GPUs 25, 100 and 250 ms "
        "cost 70.7, 61.9 and 58.7 server + PostgreSQL CPU µs a GPU row (benchmarks/HISTORY.md)",
        json_schema_extra=ADVANCED,
    )
    refit_interval_s: float = Field(
        default=21600.0,
        ge=0,
        description="Refit the risk models this often, in the background; 0 disables the schedule",
        json_schema_extra=ADVANCED,
    )
    model_min_events: int = Field(
        default=10,
        ge=1,
        description="Failures a SKU needs for its own Weibull fit",
        json_schema_extra=FLEET_POLICY,
    )
    model_min_aft_events: int = Field(
        default=20,
        ge=1,
        description="Failures with telemetry the covariate (AFT) model needs",
        json_schema_extra=FLEET_POLICY,
    )
    model_window_days: float = Field(
        default=7.0,
        gt=0,
        description="Telemetry window before each lifetime's end, in days",
        json_schema_extra=FLEET_POLICY,
    )
    model_landmark_span_days: float = Field(
        default=90.0,
        gt=0,
        le=3650,
        description="The landmark model learns from the fleet as it stood at each midnight of "
        "this many past days (every GPU's age and telemetry then, and whether it failed within "
        "each risk horizon after)",
        json_schema_extra=FLEET_POLICY,
    )
    model_landmark_max_rows: int = Field(
        default=20_000,
        ge=100,
        le=2_000_000,
        description="Most GPU-days the landmark model reads telemetry for at a refit: every one "
        "followed by a failure within the longest horizon, a weighted sample of the rest",
        json_schema_extra=ADVANCED,
    )
    model_holdout_days: float = Field(
        default=30.0,
        gt=0,
        le=3650,
        description="A refit is promoted only if it scores at least as well as the version in "
        "service on the GPUs in service this many days ago and their failures since (AUC, then "
        "average precision); one that scores worse is stored as rejected (see docs/judging.md)",
        json_schema_extra=FLEET_POLICY,
    )
    model_holdout_min_failures: int = Field(
        default=10,
        ge=1,
        description="Failures the held-out window needs before a refit is compared with the "
        "version in service; with fewer the refit is promoted and its evaluation says so",
        json_schema_extra=FLEET_POLICY,
    )
    location_pattern: str | None = Field(
        default=None,
        description="Regex with named groups parsing locations into numeric model covariates "
        "loc_<name>, e.g. fleetwatch.inventory.TITAN_LOCATION_PATTERN",
        json_schema_extra=OPERATOR,
    )
    rules_file: Path | None = Field(
        default=None,
        description="TOML with per-fleet rule overrides: [xid.<code>] rows of the Xid catalogue "
        "and a [health] table of thresholds (see docs/judging.md)",
        json_schema_extra=OPERATOR,
    )
    background_jobs: bool = Field(
        default=True,
        description="Run the background jobs (rollups, lifetimes, assessment, model refits); "
        "off only in tests that drive them by hand",
        json_schema_extra=ADVANCED,
    )
    long_poll_max_s: float = Field(
        default=60.0,
        ge=0,
        le=60,
        description="The longest GET /v1/evictions?wait= is held (wait is still accepted up to "
        "60); lower only where a client cannot wait, e.g. an API fuzzer",
        json_schema_extra=ADVANCED,
    )
    assess_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="How often the leader re-judges every GPU (rules and risk) in the background; "
        "a process that is not the leader adopts the leader's stored judgement instead "
        "(PostgreSQL), or judges for itself when there is none fresh. The agents' default push "
        "interval: more often re-judges readings already judged. Events that may drain are "
        "judged at once by the urgent lane, whatever this is",
        json_schema_extra=ADVANCED,
    )
    snapshot_poll_s: float = Field(
        default=2.0,
        ge=0,
        description="How often a process that is not the leader looks for the leader's newer "
        "stored fleet assessment (PostgreSQL); 0: every process judges the whole fleet itself",
        json_schema_extra=ADVANCED,
    )
    snapshot_stale_after_s: float = Field(
        default=300.0,
        gt=0,
        description="A process that is not the leader judges the fleet itself when the leader's "
        "stored assessment was published longer ago than this (no leader, or one stuck)",
        json_schema_extra=ADVANCED,
    )
    rollup_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="How often the hourly telemetry rollups (model covariates) are updated",
        json_schema_extra=ADVANCED,
    )
    lifecycle_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="How often GPU lifetimes are derived (installs, failures, replacements)",
        json_schema_extra=ADVANCED,
    )
    gpu_leave_after_s: float = Field(
        default=3600.0,
        gt=0,
        description="A GPU with a fatal verdict that has not reported for this long has failed",
        json_schema_extra=FLEET_POLICY,
    )
    risk_horizons_h: list[float] = Field(
        default=[24.0, 168.0],
        min_length=1,
        description="Horizons (hours) of the failure probabilities exported on /metrics",
        json_schema_extra=FLEET_POLICY,
    )
    max_steps_per_batch: int = Field(
        default=10_000,
        ge=1,
        le=100_000,
        description="Most step reports in one POST of steps",
        json_schema_extra=ADVANCED,
    )
    # Issue 40: chosen on the simulator (benchmarks/sim_budget.py, BENCHMARKS.md "What a
    # prediction is worth"): the lowest threshold whose 24-hour risk notices were right at least
    # one time in four on one simulated fleet's held-out period. At 0.5 the simulated model
    # never sent one (no node's 24-hour risk reached 0.21).
    notice_risk_threshold: float = Field(
        default=0.032,
        gt=0,
        le=1,
        description="A running job gets a risk notice when P(failure within its horizon) of one "
        "of its nodes reaches this; a job may choose its own at start",
        json_schema_extra=FLEET_POLICY,
    )
    notice_horizon_h: float = Field(
        default=24.0,
        gt=0,
        le=8760,
        description="The horizon (hours) of a job's risk notices unless it chose one at start",
        json_schema_extra=FLEET_POLICY,
    )
    notice_job_idle_s: float = Field(
        default=3600.0,
        gt=0,
        description="A job that has not ended is running while it reported within this many "
        "seconds (steps or start); only running jobs get notices",
        json_schema_extra=FLEET_POLICY,
    )
    straggler_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the straggler detector reads new step reports",
        json_schema_extra=ADVANCED,
    )
    straggler_window_s: float = Field(
        default=10.0,
        gt=0,
        description="Width of one straggler window, in the job's step time",
        json_schema_extra=FLEET_POLICY,
    )
    straggler_ratio: float = Field(
        default=1.25,
        gt=1.0,
        description="A node is slow in a window when its median step is at least this times the "
        "job's median (and a robust outlier)",
        json_schema_extra=FLEET_POLICY,
    )
    straggler_windows: int = Field(
        default=3,
        ge=1,
        description="Consecutive slow windows before a node is a straggler",
        json_schema_extra=FLEET_POLICY,
    )

    # -- eviction planner (issue 5) --
    planner_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the eviction planner turns verdicts into drains",
        json_schema_extra=ADVANCED,
    )
    planner_dry_run: bool = Field(
        default=False,
        description="Create evictions as dry-run recommendations (state recommended) only",
        json_schema_extra=OPERATOR,
    )
    drain_horizon_h: float = Field(
        default=24.0,
        gt=0,
        description="Horizon (hours) of the failure probability that drains",
        json_schema_extra=FLEET_POLICY,
    )
    gpu_hour_usd: float = Field(
        default=2.5,
        ge=0,
        description="Cost of one GPU-hour, in USD",
        json_schema_extra=FLEET_POLICY,
    )
    job_gpus: int = Field(
        default=512,
        ge=1,
        description="GPUs of the job that a node failure interrupts",
        json_schema_extra=FLEET_POLICY,
    )
    checkpoint_interval_h: float = Field(
        default=1.0,
        gt=0,
        description="Jobs' checkpoint interval; a failure loses half of one",
        json_schema_extra=FLEET_POLICY,
    )
    restart_h: float = Field(
        default=0.25,
        ge=0,
        description="Hours a job needs to restart after a failure",
        json_schema_extra=FLEET_POLICY,
    )
    drain_hours: float = Field(
        default=4.0,
        ge=0,
        description="Hours a drained node is out of service (drain + check)",
        json_schema_extra=FLEET_POLICY,
    )
    straggler_drain_after_s: float = Field(
        default=600.0,
        ge=0,
        description="A hardware straggler open this long is drained",
        json_schema_extra=FLEET_POLICY,
    )
    eviction_cooldown_s: float = Field(
        default=3600.0,
        ge=0,
        description="No new eviction of a node this soon after a rejection or a return",
        json_schema_extra=FLEET_POLICY,
    )
    repeat_offender_days: float = Field(
        default=30.0,
        ge=0,
        le=3650,
        description="A node evicted for a hardware reason again this many days after a return "
        "is a repeat offender: marked, alerted, reported, and drained first (0: off)",
        json_schema_extra=FLEET_POLICY,
    )
    drain_budget_pct: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="Most nodes draining at once, in percent of known nodes (at least one)",
        json_schema_extra=FLEET_POLICY,
    )
    unreachable_storm_pct: float = Field(
        default=4.0,
        ge=0,
        le=100,
        description="Fleet-wide silence: when more than this percent of the nodes (and at least "
        "unreachable_storm_min_nodes) are unreachable at once, the cause is shared (the "
        "server's ingest, the network): "
        "no new unreachable evictions or per-node alerts, one fleet_silence alert instead. "
        "Below drain_budget_pct, so a silence's onset cannot fill the drain budget; 0 = off",
        json_schema_extra=FLEET_POLICY,
    )
    unreachable_storm_min_nodes: int = Field(
        default=10,
        ge=2,
        description="A fleet-wide silence needs at least this many unreachable nodes: a small "
        "fleet's few silent nodes (one rack's power) are drained and paged one by one",
        json_schema_extra=FLEET_POLICY,
    )

    # -- alerts and webhooks (issue 6) --
    alert_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often active conditions are turned into alerts",
        json_schema_extra=ADVANCED,
    )
    alert_group_threshold: int = Field(
        default=10,
        ge=1,
        description="More new (or resolved) alerts than this for one subscription in one pass "
        "go out as one grouped delivery listing them",
        json_schema_extra=FLEET_POLICY,
    )
    alert_wear_out_hold_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="A wear-out onset alert stays firing this long",
        json_schema_extra=FLEET_POLICY,
    )
    runbook_base_url: str = Field(
        default="/runbooks",
        min_length=1,
        description="Where alert payloads' runbook_url points: <this>/<page>. The default is "
        "this server's own path, which serves docs/runbooks; set this server's external URL "
        "(https://fleetwatch.example.com/runbooks) to make the links clickable in Slack and "
        "PagerDuty, or a docs site's runbook folder",
        json_schema_extra=ADVANCED,
    )
    webhook_delivery_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the webhook outbox is checked for due deliveries",
        json_schema_extra=ADVANCED,
    )
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Timeout of one delivery; a worker's claim on a delivery lasts 6 times this, "
        "after which another worker sends it again (the claimer died mid-send)",
        json_schema_extra=FLEET_POLICY,
    )
    webhook_max_attempts: int = Field(
        default=12,
        ge=1,
        description="A delivery is dead after this many failed attempts",
        json_schema_extra=FLEET_POLICY,
    )
    webhook_concurrency: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Deliveries in flight at once per worker",
        json_schema_extra=ADVANCED,
    )
    alertmanager_repeat_s: float = Field(
        default=60.0,
        gt=0,
        description="Firing alerts are re-posted to Alertmanager this often (endsAt = 3x ahead)",
        json_schema_extra=FLEET_POLICY,
    )

    # -- weekly report (issue 6) --
    sla_availability: float = Field(
        default=0.99,
        gt=0,
        le=1,
        description="Availability target of the weekly report's SLA",
        json_schema_extra=FLEET_POLICY,
    )
    sla_mttr_h: float = Field(
        default=24.0,
        gt=0,
        description="Mean time to repair target (hours) of the weekly report",
        json_schema_extra=FLEET_POLICY,
    )
    sla_recovery_minutes: float = Field(
        default=15.0,
        gt=0,
        description="Time-to-recover target (minutes): from a failure to the job resumed where "
        "jobs report restarts, else to the node back in service",
        json_schema_extra=FLEET_POLICY,
    )
    job_failure_before_s: float = Field(
        default=1800.0,
        ge=0,
        description="A failed job is interrupted by hardware when one of its nodes failed or "
        "was drained by a rule at most this long before the job's end",
        json_schema_extra=FLEET_POLICY,
    )
    job_failure_after_s: float = Field(
        default=300.0,
        ge=0,
        description="... or at most this long after it (the failure seen late)",
        json_schema_extra=FLEET_POLICY,
    )
    report_delay_h: float = Field(
        default=6.0,
        ge=0,
        description="Hours after Monday 00:00 UTC before last week's report is built and sent",
        json_schema_extra=FLEET_POLICY,
    )

    # -- storage lifecycle (issue 12) --
    raw_retention_days: float = Field(
        default=14.0,
        description="Days raw samples are kept; PostgreSQL drops them a whole day "
        "at a time, so up to one day more. At least 8: the hourly rollups are recomputed from "
        "raw samples up to 7 days back. The weekly report's energy figures read raw samples "
        "of its week",
        json_schema_extra=OPERATOR,
    )
    rollup_retention_days: float = Field(
        default=730.0,
        description="Days the hourly rollups (gpu_hourly, the risk models' covariates) are "
        "kept; at least raw_retention_days. Events, verdicts, evictions and lifetimes are kept",
        json_schema_extra=OPERATOR,
    )
    retention_interval_s: float = Field(
        default=600.0,
        gt=0,
        description="How often expired samples and rollups are deleted and, on PostgreSQL, "
        "day partitions are created ahead and dropped past retention",
        json_schema_extra=ADVANCED,
    )

    # -- full disk and secrets (issue 10) --
    storage_min_free_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=0,
        description="/readyz says not ready while the SQLite file's filesystem has less free "
        "space than this; 0 turns the check off",
        json_schema_extra=ADVANCED,
    )
    storage_full_hold_s: float = Field(
        default=30.0,
        gt=0,
        description="/readyz says not ready until this long after the last write that failed on "
        "a full disk",
        json_schema_extra=ADVANCED,
    )
    secret_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Fernet keys, comma-separated, that encrypt webhook secrets at rest: the "
        "first encrypts, all decrypt (rotation). Unset: SQLite keeps a generated key in "
        "<database>.key, PostgreSQL refuses webhook secrets. `fleetwatch secrets generate-key`",
        json_schema_extra=OPERATOR,
    )

    @field_validator("remote_write_node_labels")
    @classmethod
    def _node_labels_named(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one label (e.g. Hostname)")
        return value

    @field_validator("remote_write_node_labels", "secret_keys", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("secret_keys")
    @classmethod
    def _fernet_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for position, key in enumerate(keys, 1):
            try:
                raw = base64.urlsafe_b64decode(key.get_secret_value().encode())
            except (ValueError, binascii.Error):
                raw = b""
            if len(raw) != 32:
                raise ValueError(
                    f"key {position} is not a Fernet key (32 bytes, url-safe base64); "
                    "make one with `fleetwatch secrets generate-key`"
                )
        return keys

    @field_validator("raw_retention_days")
    @classmethod
    def _outlive_rollup_backfill(cls, days: float) -> float:
        if days < MIN_RAW_RETENTION_DAYS:
            raise ValueError(
                f"raw_retention_days must be at least {MIN_RAW_RETENTION_DAYS:g}: the hourly "
                "rollups are recomputed from raw samples up to 7 days back (late spool "
                "replays), and an hour recomputed without its samples would lose its rollup"
            )
        return days

    @model_validator(mode="after")
    def _rollups_outlive_samples(self) -> ServerSettings:
        if self.rollup_retention_days < self.raw_retention_days:
            raise ValueError(
                f"rollup_retention_days ({self.rollup_retention_days:g}) must be at least "
                f"raw_retention_days ({self.raw_retention_days:g})"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_together(self) -> ServerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(
                "tls_cert and tls_key go together: set both to serve HTTPS, or neither"
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key: mutual TLS is TLS first")
        return self

    @field_validator("database_url")
    @classmethod
    def _use_psycopg3(cls, url: str) -> str:
        # SQLAlchemy's bare postgresql:// means psycopg2, which we do not ship.
        for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not url.startswith(("sqlite://", "postgresql+psycopg://")):
            raise ValueError("database_url must start with sqlite:// or postgresql://")
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def _problems(exc: ValidationError, settings: type[BaseSettings]) -> str:
    """One clause per error, each naming the setting and the environment variable that sets it."""
    clauses = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        clause = f"{where}: {err['msg']}"
        field = err["loc"][0] if err["loc"] else None
        if isinstance(field, str) and field in settings.model_fields:
            clause += f" (environment variable {env_var(settings, field)})"
        clauses.append(clause)
    return "; ".join(clauses)


def _unparsable(exc: SettingsError, settings: type[BaseSettings]) -> str:
    # pydantic-settings decodes a list or mapping from the environment as JSON before validating,
    # and its error names neither the variable nor what it expected.
    found = re.search(r'field "(\w+)"', str(exc))
    if found is None or found.group(1) not in settings.model_fields:
        return str(exc)
    field = found.group(1)
    default = settings.model_fields[field].get_default(call_default_factory=True)
    return (
        f"{field}: {env_var(settings, field)} is not valid JSON "
        f"(written like its default, {json.dumps(default)})"
    )


def env_var(settings: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field``, e.g. FLEETWATCH_SERVER_PORT."""
    return f"{settings.model_config.get('env_prefix', '')}{field}".upper()


def load_server_settings(**overrides: Any) -> ServerSettings:
    """Build settings from the environment, with explicit values (e.g. CLI flags) on top."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return ServerSettings(**given)
    except ValidationError as exc:
        problems = _problems(exc, ServerSettings)
        raise ConfigError(f"invalid server settings: {problems}") from exc
    except SettingsError as exc:
        problem = _unparsable(exc, ServerSettings)
        raise ConfigError(f"invalid server settings: {problem}") from exc


KNOWN_COLLECTORS = ("nvml", "dcgm-exporter", "nvidia-smi", "kernel-log", "infiniband", "sim")


def _split_list(value: Any) -> Any:
    """A comma-separated list, or a JSON list (what `fleetwatch server` hands its workers)."""
    if isinstance(value, str) and value.strip().startswith("["):
        return json.loads(value)
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class AgentSettings(BaseSettings):
    """The node agent. Environment: ``FLEETWATCH_AGENT_<NAME>``; file: TOML with the same keys."""

    model_config = SettingsConfigDict(env_prefix="FLEETWATCH_AGENT_", extra="forbid")

    server_url: str = Field(
        default="http://127.0.0.1:8400",
        description="FleetWatch server base URL",
        json_schema_extra=OPERATOR,
    )
    token: SecretStr | None = Field(
        default=None, description="Bearer token with agent scope", json_schema_extra=OPERATOR
    )
    token_file: Path | None = Field(
        default=None, description="File holding the token", json_schema_extra=OPERATOR
    )
    node_name: str = Field(
        default_factory=socket.gethostname,
        description="Node name (default: hostname)",
        json_schema_extra={**OPERATOR, "default_shown": "the hostname"},
    )
    labels: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Node labels, e.g. cluster=a,rack=r12",
        json_schema_extra=OPERATOR,
    )
    interval_s: float = Field(
        default=10.0, gt=0, le=3600, description="Collection interval", json_schema_extra=OPERATOR
    )
    push_interval_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Push every this many seconds (a whole number of intervals), with the "
        "collections in between staged in the spool; 0 or at most the interval: push each "
        "collection. Xid and lost-GPU events are pushed at once",
        json_schema_extra=OPERATOR,
    )
    collectors: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["nvml", "kernel-log"],
        description=f"Sources to read, comma-separated: {', '.join(KNOWN_COLLECTORS)}",
        json_schema_extra=OPERATOR,
    )
    spool_dir: Path = Field(
        default=Path("/var/lib/fleetwatch/spool"),
        description="Durable spool: batches wait here until the server acknowledges them",
        json_schema_extra=OPERATOR,
    )
    spool_max_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1024 * 1024,
        description="Spool bound; oldest dropped beyond",
        json_schema_extra=OPERATOR,
    )
    poison_after_s: float = Field(
        default=600.0,
        ge=0,
        description="Set a batch aside after plain 500s this long while the server takes others",
        json_schema_extra=ADVANCED,
    )
    ca_bundle: Path | None = Field(
        default=None,
        description="CA bundle the server's certificate must chain to (else the public roots); "
        "unset here, FLEETWATCH_CA_BUNDLE, which every FleetWatch client reads",
        json_schema_extra=OPERATOR,
    )
    client_cert: Path | None = Field(
        default=None,
        description="Client certificate (PEM) for a server that requires one (mutual TLS), "
        "naming this node (subject CN or a DNS SAN); unset here, FLEETWATCH_CLIENT_CERT",
        json_schema_extra=OPERATOR,
    )
    client_key: Path | None = Field(
        default=None,
        description="Private key of client_cert, unless that file holds it; unset here, "
        "FLEETWATCH_CLIENT_KEY",
        json_schema_extra=OPERATOR,
    )
    allow_insecure_http: bool = Field(
        default=False,
        description="Send the token over plain http:// to a server other than this machine "
        "(loopback); refused otherwise, and said in the log when allowed",
        json_schema_extra=OPERATOR,
    )
    push_timeout_s: float = Field(
        default=15.0, gt=0, description="Timeout of one push", json_schema_extra=ADVANCED
    )
    dcgm_url: str = Field(
        default="http://127.0.0.1:9400/metrics",
        description="dcgm-exporter /metrics URL, or a file path",
        json_schema_extra=OPERATOR,
    )
    nvidia_smi: str = Field(
        default="nvidia-smi -q -x",
        description="Command to run, or a file with its XML output",
        json_schema_extra=OPERATOR,
    )
    kernel_log: str = Field(
        default="auto",
        description="auto (/dev/kmsg, else journalctl -k -f), kmsg, journal, or a file to follow",
        json_schema_extra=OPERATOR,
    )
    infiniband_root: Path = Field(
        default=Path("/sys/class/infiniband"),
        description="Where the infiniband collector reads adapter ports (a captured tree in tests)",
        json_schema_extra=ADVANCED,
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve agent self-metrics on this port",
        json_schema_extra=OPERATOR,
    )
    sim_spec: Path | None = Field(
        default=None, description="Simulated fleet spec (sim collector)", json_schema_extra=ADVANCED
    )
    boot_id: str | None = Field(
        default=None,
        description="Override the node's boot id (default: the kernel's)",
        json_schema_extra=ADVANCED,
    )

    @field_validator("labels", mode="before")
    @classmethod
    def _parse_labels(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs = _split_list(value)
            parsed = {}
            for pair in pairs:
                key, sep, val = pair.partition("=")
                if not sep:
                    raise ValueError(f"label {pair!r} must look like key=value")
                parsed[key.strip()] = val.strip()
            return parsed
        return value

    @field_validator("collectors", mode="before")
    @classmethod
    def _parse_collectors(cls, value: Any) -> Any:
        value = _split_list(value)
        unknown = [c for c in value if c not in KNOWN_COLLECTORS]
        if unknown:
            raise ValueError(
                f"unknown collector(s) {', '.join(unknown)}; known: {', '.join(KNOWN_COLLECTORS)}"
            )
        return value

    def client_tls(self) -> ClientTls:
        return ClientTls(self.ca_bundle, self.client_cert, self.client_key)

    def token_in_clear(self) -> bool:
        """Whether pushes carry the token in clear to another machine (plain http://)."""
        plain = self.server_url.strip().lower().startswith("http://")
        return plain and not is_loopback_url(self.server_url.strip())

    def plain_http_problem(self) -> str | None:
        """Why the token may not go to server_url (plain HTTP to another machine), or None."""
        if not self.token_in_clear() or self.allow_insecure_http:
            return None
        return (
            f"server_url {self.server_url} is plain HTTP to another machine: the token would "
            "cross the network in clear. Use https:// (and --ca-bundle), or say "
            "--allow-insecure-http (FLEETWATCH_AGENT_ALLOW_INSECURE_HTTP=true) on a network "
            "you trust"
        )

    def bearer_token(self) -> str | None:
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read token_file {self.token_file}: {exc}") from exc
        return None


_SHARED_CLIENT_ENV = {
    "ca_bundle": CA_BUNDLE_ENV,
    "client_cert": CLIENT_CERT_ENV,
    "client_key": CLIENT_KEY_ENV,
}


def load_agent_settings(config_file: Path | None = None, **flags: Any) -> AgentSettings:
    """Flags over environment over the TOML file over defaults; the TLS files (ca_bundle,
    client_cert, client_key) then fall back to the variables every client reads
    (``FLEETWATCH_CA_BUNDLE``, ...)."""
    from_file: dict[str, Any] = {}
    if config_file is not None:
        try:
            from_file = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read agent config {config_file}: {exc}") from exc
    # Keyword arguments beat the environment in pydantic-settings, so file values that the
    # environment also sets are left out for the environment to win.
    values = {
        key: value
        for key, value in from_file.items()
        if f"FLEETWATCH_AGENT_{key.upper()}" not in os.environ
    }
    values.update({key: value for key, value in flags.items() if value is not None})
    # The TLS files every FleetWatch client reads (fleetwatch.client_tls), below the agent's own.
    for key, shared in _SHARED_CLIENT_ENV.items():
        own = f"FLEETWATCH_AGENT_{key.upper()}"
        if key not in values and own not in os.environ and os.environ.get(shared, "").strip():
            values[key] = os.environ[shared].strip()
    try:
        return AgentSettings(**values)
    except ValidationError as exc:
        raise ConfigError(f"invalid agent settings: {_problems(exc, AgentSettings)}") from exc
    except SettingsError as exc:
        problem = _unparsable(exc, AgentSettings)
        raise ConfigError(f"invalid agent settings: {problem}") from exc
