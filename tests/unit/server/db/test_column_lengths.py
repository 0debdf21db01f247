"""Every stored string fits what the edge accepts: a column too short for a value a client may
send (or one the server derives from it) fails a background job for the whole fleet on
PostgreSQL (issue 10: a 253-character node name made ``node:<name>:unreachable`` overflow the
alert key and stopped all alerting).

The bounds are *probed* from the wire validation (the longest value each model or parameter
accepts), not copied, so tightening or loosening a limit at the edge is checked here too. Every
length-bounded column must be listed; a new one without a bound fails the test.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy import String, Text

from fleetwatch.inventory import _MAX_LOCATION, _MAX_SERIAL
from fleetwatch.rules.xid_catalog import ACTION_RANK, SEVERITY_RANK
from fleetwatch.server.auth import SCOPES
from fleetwatch.server.db.tables import metadata
from fleetwatch.server.ingest.remote_write_readings import MAX_HA_LABEL
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.repo.evictions import OPEN_STATES
from fleetwatch.server.repo.fleet_snapshots import FLEET
from fleetwatch.server.routers.jobs import JobId
from fleetwatch.server.routers.lifetimes import LifetimeEnd
from fleetwatch.server.routers.tokens import TokenCreate
from fleetwatch.server.schemas.jobs import StepReport
from fleetwatch.server.schemas.notices import NoticeAction, NoticeKind
from fleetwatch.server.schemas.webhooks import Kind, WebhookCreate
from fleetwatch.telemetry import (
    Batch,
    Event,
    GpuIdentity,
    NodeInfo,
    PortSample,
    normalize_pci_bus_id,
)

_CEILING = 100_000  # probing stops here: a field accepting this much has no meaningful bound


def longest(accepts: Callable[[int], bool]) -> int:
    """The longest length ``accepts`` takes (acceptance is monotone: all up to N, none above)."""
    assert accepts(1), "the probe itself is wrong: a 1-character value is refused"
    if accepts(_CEILING):
        return _CEILING
    lo, hi = 1, _CEILING
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accepts(mid) else (lo, mid)
    return lo


def _accepts(
    model: type[BaseModel], build: Callable[[int], dict[str, Any]]
) -> Callable[[int], bool]:
    def check(n: int) -> bool:
        try:
            model.model_validate(build(n))
        except ValidationError:
            return False
        return True

    return check


def _adapter_accepts(
    adapter: TypeAdapter[Any], build: Callable[[int], Any]
) -> Callable[[int], bool]:
    def check(n: int) -> bool:
        try:
            adapter.validate_python(build(n))
        except ValidationError:
            return False
        return True

    return check


def _gpu(**extra: Any) -> dict[str, Any]:
    return {"uuid": "GPU-1", "index": 0, **extra}


def _port(**extra: Any) -> dict[str, Any]:
    return {"device": "mlx5_0", "port": 1, "ts": datetime(2026, 12, 1, tzinfo=UTC), **extra}


def _step(node: str) -> dict[str, Any]:
    return {"rank": 0, "node": node, "step": 1, "duration_ms": 1.0, "ts": "2026-12-01T00:00:00Z"}


@functools.cache
def wire_bounds() -> dict[str, int]:
    """The longest value of each wire field, probed from its validation."""
    node = longest(_accepts(NodeInfo, lambda n: {"name": "a" * n}))
    step_node = longest(_accepts(StepReport, lambda n: _step("a" * n)))
    uuid = longest(_accepts(GpuIdentity, lambda n: _gpu(uuid="GPU-" + "a" * max(n - 4, 1))))
    batch_id = longest(_accepts(Batch, lambda n: {"batch_id": "b" * n, "node": {"name": "n"}}))
    event = lambda **f: {"kind": "k", "ts": datetime(2026, 12, 1, tzinfo=UTC), **f}  # noqa: E731
    return {
        "node": max(node, step_node),
        "uuid": uuid,
        "label_value": longest(
            _accepts(NodeInfo, lambda n: {"name": "n", "labels": {"c": "v" * n}})
        ),
        "agent_version": longest(
            _accepts(NodeInfo, lambda n: {"name": "n", "agent_version": "v" * n})
        ),
        "boot_id": longest(_accepts(NodeInfo, lambda n: {"name": "n", "boot_id": "b" * n})),
        "serial": longest(_accepts(GpuIdentity, lambda n: _gpu(serial="s" * n))),
        "gpu_name": longest(_accepts(GpuIdentity, lambda n: _gpu(name="g" * n))),
        "driver_version": longest(_accepts(GpuIdentity, lambda n: _gpu(driver_version="d" * n))),
        "vbios_version": longest(_accepts(GpuIdentity, lambda n: _gpu(vbios_version="v" * n))),
        # Stored normalised: the widest domain, bus, device and function.
        "pci_bus_id": len(normalize_pci_bus_id("0000ffff:ff:1f.7")),
        "event_kind": longest(_accepts(Event, lambda n: event(kind="k" * n))),
        "process": longest(_accepts(Event, lambda n: event(process="p" * n))),
        "batch_id": batch_id,
        "job_id": longest(_adapter_accepts(TypeAdapter(JobId), lambda n: "j" * n)),
        "port_device": longest(_accepts(PortSample, lambda n: _port(device="d" * n))),
        "link_layer": longest(_accepts(PortSample, lambda n: _port(link_layer="L" * n))),
        # The GUID's one form: 4 groups of 4 hex digits.
        "node_guid": len("0a7f:bc12:45ef:d23b"),
        "netdev": longest(_accepts(PortSample, lambda n: _port(netdev="i" * n))),
        "port_state": longest(_accepts(PortSample, lambda n: _port(state="S" * n))),
        "phys_state": longest(_accepts(PortSample, lambda n: _port(phys_state="S" * n))),
        "link_speed": longest(_accepts(PortSample, lambda n: _port(link_speed="N" * n))),
        "token_name": longest(_accepts(TokenCreate, lambda n: {"name": "t" * n, "scope": "read"})),
        "webhook_name": longest(
            _accepts(
                WebhookCreate, lambda n: {"name": "w" * n, "kind": "generic", "url": "http://x"}
            )
        ),
    }


def _vocabulary(*values: Any) -> int:
    return max(len(str(v)) for v in values)


@functools.cache
def column_bounds() -> dict[str, int]:
    """The longest value each string column may be given, from the wire or the server's own
    vocabulary."""
    w = wire_bounds()
    eviction_states = (*OPEN_STATES, "rejected", "cancelled", "returned")
    alert_kinds = (*get_args(Verdict.__annotations__["kind"]), "unreachable", "straggler",
                   "drain_budget", "wear_out", "repeat_offender")  # fmt: skip
    return {
        "nodes.name": w["node"],
        "nodes.agent_version": w["agent_version"],
        "nodes.boot_id": w["boot_id"],
        "gpus.uuid": w["uuid"],
        "gpus.serial": w["serial"],
        "gpus.pci_bus_id": w["pci_bus_id"],
        "gpus.name": w["gpu_name"],
        "gpus.driver_version": w["driver_version"],
        "gpus.vbios_version": w["vbios_version"],
        "node_boots.boot_id": w["boot_id"],
        "node_ports.device": w["port_device"],
        "node_ports.boot_id": w["boot_id"],
        "node_ports.link_layer": w["link_layer"],
        "node_ports.node_guid": w["node_guid"],
        "node_ports.netdev": w["netdev"],
        "node_ports.state": w["port_state"],
        "node_ports.phys_state": w["phys_state"],
        "node_ports.link_speed": w["link_speed"],
        "gpu_hourly.gpu_uuid": w["uuid"],
        "events.gpu_uuid": w["uuid"],
        "events.pci_bus_id": w["pci_bus_id"],
        "events.kind": w["event_kind"],
        "events.process": w["process"],
        "events.batch_id": w["batch_id"],
        "ingest_batches.batch_id": w["batch_id"],
        "ingest_batches.content_sha256": 64,
        # Prometheus remote write (server/ingest/remote_write_store.py builds the keys): a GPU's
        # UUID or "port:<node>:<device>:<port>"; "xid:<uuid>" or "edac:<node>:<mc>:<kind>"
        # (a memory controller below 10**6); the HA labels are used only up to 256 characters.
        "remote_write_staging.key": max(w["uuid"], 5 + w["node"] + 1 + w["port_device"] + 4),
        "remote_write_staging.node": w["node"],
        "remote_write_state.key": max(4 + w["uuid"], 5 + w["node"] + 1 + 6 + 1 + 11),
        "remote_write_replicas.cluster": MAX_HA_LABEL,
        "remote_write_replicas.replica": MAX_HA_LABEL,
        # A GPU without a serial is tracked by its UUID; imported serials have their own cap.
        "gpu_lifetimes.serial": max(w["serial"], w["uuid"], _MAX_SERIAL),
        "gpu_lifetimes.gpu_uuid": w["uuid"],
        "gpu_lifetimes.location": max(w["node"] + 1 + w["pci_bus_id"], _MAX_LOCATION),
        "gpu_lifetimes.sku": w["gpu_name"],
        "gpu_lifetimes.end_kind": _vocabulary(
            *get_args(LifetimeEnd.model_fields["kind"].annotation)
        ),
        "gpu_lifetimes.source": _vocabulary("observed", "operator", "import"),
        "api_tokens.token_id": 12,  # secrets.token_hex(6)
        "api_tokens.name": w["token_name"],
        "api_tokens.scope": _vocabulary(*SCOPES),
        "api_tokens.secret_sha256": 64,
        "api_tokens.node_pattern": 253,  # auth._checked_pattern: a node name's length at most
        "risk_models.trigger": _vocabulary("schedule", "manual", "startup"),
        "risk_models.status": _vocabulary("ok", "failed"),
        "job_steps.job_id": w["job_id"],
        "job_steps.node": w["node"],
        "jobs.job_id": w["job_id"],
        "jobs.outcome": _vocabulary("completed", "failed", "cancelled"),
        "job_checkpoints.job_id": w["job_id"],
        "job_restarts.job_id": w["job_id"],
        "job_notices.job_id": w["job_id"],
        "job_notices.node": w["node"],
        "job_notices.gpu": w["uuid"],
        "job_notices.kind": _vocabulary(*get_args(NoticeKind)),
        "job_notices.action": _vocabulary(*get_args(NoticeAction)),
        "stragglers.job_id": w["job_id"],
        "stragglers.node": w["node"],
        "stragglers.kind": _vocabulary("hardware", "workload"),
        "node_slowness.node": w["node"],
        "straggler_state.job_id": w["job_id"],
        "leader_state.name": _vocabulary("planner", "rollups"),  # the jobs that keep state
        "fleet_snapshots.name": _vocabulary(FLEET),  # the snapshots shared
        "evictions.node": w["node"],
        "evictions.state": _vocabulary(*eviction_states),
        "evictions.reason_kind": _vocabulary("rule", "risk", "straggler"),
        "evictions.claimed_by": w["token_name"],
        "node_validations.node": w["node"],
        "node_validations.pushed_by": w["token_name"],
        "eviction_audit.node": w["node"],
        "eviction_audit.from_state": _vocabulary(*eviction_states),
        "eviction_audit.to_state": _vocabulary(*eviction_states),
        "eviction_audit.actor": max(w["token_name"], len("planner")),
        "maintenance_windows.created_by": w["token_name"],
        "maintenance_windows.ended_by": w["token_name"],
        "webhook_subscriptions.name": w["webhook_name"],
        "webhook_subscriptions.kind": _vocabulary(*get_args(Kind)),
        "webhook_subscriptions.secret": 256,
        "alerts.dedup_key": max(
            len("node:") + w["node"] + len(":unreachable"),
            len("gpu:") + w["uuid"] + 1 + 64,  # a rule name: an Xid rule or a health check
            len("fleet:wear_out:") + w["gpu_name"],  # a wear-out group is a SKU
        ),
        "alerts.state": _vocabulary("firing", "resolved"),
        "alerts.kind": _vocabulary(*alert_kinds),
        "alerts.severity": _vocabulary(*SEVERITY_RANK),
        "alerts.node": w["node"],
        "alerts.gpu_uuid": w["uuid"],
        "alerts.serial": w["serial"],
        "alerts.slot": w["pci_bus_id"],
        "alerts.cluster": w["label_value"],
        "alerts.action": _vocabulary(*ACTION_RANK),
        "webhook_outbox.event": _vocabulary("trigger", "resolve", "report"),
        # trigger:s<id>:a<id>, resolve:s<id>:g<a>-<b>:<n>, refresh:s<id>:<bucket>, weekly:<week>
        "webhook_outbox.idempotency_key": len("resolve:s:g-:") + 4 * 20,
        "webhook_outbox.state": _vocabulary("pending", "delivered", "dead"),
    }


def _length(table: str, column: str) -> int | None:
    """The column's declared length; None for unbounded text."""
    kind = metadata.tables[table].columns[column].type
    assert isinstance(kind, String), f"{table}.{column} is not a string column"
    return None if isinstance(kind, Text) else kind.length


def test_every_bounded_string_column_has_a_declared_source() -> None:
    bounds = column_bounds()
    bounded = {
        f"{table.name}.{column.name}"
        for table in metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, String) and not isinstance(column.type, Text)
    }
    missing = sorted(bounded - set(bounds))
    assert missing == [], f"say in column_bounds() what may be written into {missing}"


def test_wire_probes_find_the_documented_limits() -> None:
    w = wire_bounds()
    # The case: node names to 253, so the unreachable key is 270 characters.
    assert w["node"] == 253
    assert w["uuid"] == 124
    assert w["label_value"] == 256


@pytest.mark.parametrize("name", sorted(column_bounds()))
def test_column_holds_the_longest_value_it_may_be_given(name: str) -> None:
    bound = column_bounds()[name]
    table, column = name.split(".")
    length = _length(table, column)
    assert length is None or length >= bound, (
        f"{name} is {length} long but may be given {bound} characters: widen it (Text where the "
        "length means nothing) in tables.py and a migration"
    )
