"""GPU lifetimes derived from what the agents report: installs, failures, replacements, returns.

:func:`sync_lifetimes` brings ``gpu_lifetimes`` up to date with ``gpus``, ``events`` and
the sample blocks in a handful of bulk queries; a second run changes nothing. A GPU is keyed by
its serial, or by its UUID when it reports none, so a lifetime's ``serial`` may hold a UUID. Rules:

1. **Install** - a serial key with no lifetime at all gets an open ``observed`` lifetime from the
   GPU's first reading (or ``first_seen``, if earlier), located at ``<node name>/<pci_bus_id or
   index>``. That is when FleetWatch first saw it: a GPU in service before then is older than its
   lifetime says, unless an imported inventory record gives its real install date.
2. **Replacement** - a GPU whose slot (node and PCI bus id, else node and index) was later taken
   by another serial key (first seen at or after its last sighting) is closed at its last
   sighting: ``failure`` after a fatal verdict in the 24 h before it, else ``retirement``; the
   evidence names the newcomer in ``replaced_by``.
3. **Failure** - a GPU with a fatal verdict, silent for over ``leave_after_s``, fails at the
   verdict's first event, if that is within ``leave_after_s`` of its last sighting: a GPU that
   reported longer after the fault was reset and back in service, and later silence is not it.
4. **Return** - a serial whose newest lifetime is closed (any source) but whose GPU reported over
   ``leave_after_s`` after the removal is reopened at its first sample after ``removed_at +
   leave_after_s`` (samples in that grace period are the dying GPU's).

Two clocks: "silent" is measured on the server's (``last_seen``, when the last batch arrived), while
"last sighting", failure and return times are on the agent's (``latest_ts``, the newest sample),
the clock its Xid events are stamped in, so a late or simulated agent is judged consistently.

A fatal verdict is a :func:`~fleetwatch.rules.xid.judge_xids` verdict that counts against the GPU
with severity critical or fatal, or a ``gpu_lost`` event; after a return, only events since the
previous removal (and its grace) count. Only ``observed`` lifetimes are closed here; ``import``
and ``operator`` rows are never changed.

Maintenance windows (``server.concepts.planned``): a ``gpu_lost`` event inside a window of the
GPU's node is a planned reset or power-off, not a failure, and is not counted; a fatal Xid inside
one is a hardware fault like any other and still ends the lifetime as a failure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from fleetwatch.config import ServerSettings
from fleetwatch.rules.xid import XidCatalog, XidVerdict, judge_xids
from fleetwatch.server.db.sample_blocks import MAX_BLOCK_SPAN_US
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpu_lifetimes, gpu_sample_blocks, gpus, nodes
from fleetwatch.server.repo.maintenance import maintenance_intervals
from fleetwatch.server.repo.sample_reader import from_us, read_samples
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.locks import LockKey, transaction_lock, try_transaction_lock
from fleetwatch.server.runtime.passes import give_way

__all__ = ["LifecycleCounts", "run_lifecycle", "sync_lifetimes"]

LOOKBACK = timedelta(hours=24)
_CHUNK = 500  # uuids per IN (...) list, well under SQLite's bound-parameter limit
_INSERT_CHUNK = 2_000  # lifetimes opened per INSERT, between two chances to give way
_FATAL_SEVERITIES = frozenset({"critical", "fatal"})
_ENDING = ("b_id", "removed_at", "end_kind", "cause", "evidence")


# What a fatal verdict is read from: Xid and gpu_lost events, as judge_xids reads them.
_XID_EVENT_COLUMNS = (
    events.c.kind,
    events.c.xid,
    events.c.ts,
    events.c.pci_bus_id,
    events.c.message,
    events.c.gpu_uuid.label("uuid"),
    events.c.pid,
    events.c.process,
    events.c.node_id,
)


@dataclass(frozen=True)
class LifecycleCounts:
    """What one sync changed. ``replacements`` counts every GPU found replaced, whatever its end
    kind; ``failures`` counts every failure ending, replaced or not."""

    opened: int = 0
    failures: int = 0
    replacements: int = 0
    returned: int = 0


@dataclass(frozen=True)
class _Gpu:
    uuid: str
    key: str  # serial, else UUID
    node_id: int
    node: str
    slot: tuple[int, str]
    location: str
    sku: str | None
    first_seen: datetime
    last_seen: datetime  # server clock: when its last batch arrived
    last_sample: datetime  # agent clock: its newest reading, the clock its Xids are stamped in


@dataclass(frozen=True)
class _Stint:
    """A serial's newest lifetime, and when the one before it ended (None: it is the first)."""

    id: int
    installed_at: datetime
    removed_at: datetime | None
    source: str
    previous_end: datetime | None


@dataclass(frozen=True)
class _Fatal:
    at: datetime
    cause: str
    evidence: dict[str, Any]


def run_lifecycle(
    db: Database,
    settings: ServerSettings,
    catalog: XidCatalog,
    now: datetime | None = None,
    guard: ItemGuard | None = None,
) -> LifecycleCounts | None:
    """The leader's lifecycle job: one sync, skipped (None) while another process runs one."""
    with db.write() as conn:
        if not try_transaction_lock(conn, LockKey.LIFECYCLE_PASS):
            return None
        return sync_lifetimes(
            conn,
            now=now or datetime.now(UTC),
            catalog=catalog,
            leave_after_s=settings.gpu_leave_after_s,
            guard=guard,
        )


def sync_lifetimes(
    conn: Connection,
    *,
    now: datetime,
    catalog: XidCatalog,
    leave_after_s: float = 3600.0,
    guard: ItemGuard | None = None,
) -> LifecycleCounts:
    """Open, close and reopen ``observed`` lifetimes to match the fleet (see the module doc)."""
    transaction_lock(conn, LockKey.LIFECYCLE)
    leave_after = timedelta(seconds=leave_after_s)
    fleet = _load_gpus(conn)
    newest = _newest_lifetimes(conn)
    guard = guard or ItemGuard("lifecycle")
    opened = _install(conn, [g for g in fleet.values() if g.key not in newest], guard)
    if opened:
        newest = _newest_lifetimes(conn)
    open_observed = {
        key: row
        for key, row in newest.items()
        if key in fleet and row.removed_at is None and row.source == "observed"
    }
    replaced = _replacements(fleet.values(), open_observed)
    silent = [
        g
        for key, g in fleet.items()
        if key in open_observed and key not in replaced and g.last_seen < now - leave_after
    ]
    candidates = [fleet[k] for k in replaced] + silent
    fatal = _fatal_verdicts(conn, candidates, open_observed, catalog, leave_after)
    endings: list[tuple[int, datetime, str, str, dict[str, Any]]] = []
    for key, newcomer in replaced.items():
        lifetime, found, by = open_observed[key], fatal.get(key), {"replaced_by": newcomer.key}
        if found is None:
            cause = f"replaced by {newcomer.key}, no fatal verdict on record"
            endings.append((lifetime.id, fleet[key].last_sample, "retirement", cause, by))
        else:
            cause = f"{found.cause}; replaced by {newcomer.key}"
            evidence = {**found.evidence, **by}
            endings.append((lifetime.id, fleet[key].last_sample, "failure", cause, evidence))
    for g in silent:
        lifetime, found = open_observed[g.key], fatal.get(g.key)
        if found is not None and found.at >= g.last_sample - leave_after:
            at = max(found.at, lifetime.installed_at)
            endings.append((lifetime.id, at, "failure", found.cause, found.evidence))
    ending = (
        update(gpu_lifetimes)
        .where(
            gpu_lifetimes.c.id == bindparam("b_id"),
            gpu_lifetimes.c.removed_at.is_(None),
            gpu_lifetimes.c.source == "observed",
        )
        .values({k: bindparam(k) for k in _ENDING[1:]})
    )
    guard.many(
        conn,
        [dict(zip(_ENDING, e, strict=True)) for e in endings],
        lambda rows: conn.execute(ending, rows),
        ident=lambda row: f"lifetime {row['b_id']}",
    )
    returned = _returns(conn, fleet, newest, leave_after, guard)
    return LifecycleCounts(
        opened=opened,
        failures=sum(1 for e in endings if e[2] == "failure"),
        replacements=len(replaced),
        returned=returned,
    )


def _load_gpus(conn: Connection) -> dict[str, _Gpu]:
    """Every GPU by serial key; when two rows share a key, the one seen last stands for it."""
    g = gpus.c
    columns = (g.uuid, g.serial, g.node_id, g.index, g.pci_bus_id, g.name)
    seen = (g.first_seen, g.last_seen, g.latest_ts)
    query = select(*columns, *seen, nodes.c.name.label("node_name")).join(
        nodes, nodes.c.id == g.node_id
    )
    fleet: dict[str, _Gpu] = {}
    for row in conn.execute(query.order_by(gpus.c.last_seen, gpus.c.uuid)):
        place = row.pci_bus_id or str(row.index)
        first = fleet[key].first_seen if (key := row.serial or row.uuid) in fleet else None
        fleet[key] = _Gpu(
            uuid=row.uuid,
            key=key,
            node_id=row.node_id,
            node=row.node_name,
            slot=(row.node_id, row.pci_bus_id or f"#{row.index}"),
            location=f"{row.node_name}/{place}",
            sku=row.name,
            first_seen=min(row.first_seen, first) if first else row.first_seen,
            last_seen=row.last_seen,
            last_sample=row.latest_ts or row.last_seen,
        )
    return fleet


def _newest_lifetimes(conn: Connection) -> dict[str, _Stint]:
    """The newest lifetime of every serial key the fleet reports, by key."""
    keys = select(func.coalesce(gpus.c.serial, gpus.c.uuid))
    lt = gpu_lifetimes.c
    query = (
        select(lt.id, lt.serial, lt.installed_at, lt.removed_at, lt.source)
        .where(lt.serial.in_(keys))
        .order_by(lt.installed_at, lt.id)
    )
    newest: dict[str, _Stint] = {}
    for row in conn.execute(query):
        before = newest.get(row.serial)
        ended = before.removed_at if before else None
        newest[row.serial] = _Stint(row.id, row.installed_at, row.removed_at, row.source, ended)
    return newest


def _opening(g: _Gpu, installed_at: datetime) -> dict[str, Any]:
    return {
        "serial": g.key,
        "gpu_uuid": g.uuid,
        "node_id": g.node_id,
        "location": g.location,
        "sku": g.sku,
        "installed_at": installed_at,
        "source": "observed",
    }


def _first_samples(conn: Connection, uuids: list[str]) -> dict[str, datetime]:
    """Each GPU's oldest reading (agent clock), per chunk of new GPUs.

    The MIN is a subquery per GPU on purpose: ``min(ts0) WHERE gpu_id = <one id>`` is the first
    entry of that GPU in the ``(gpu_id, ts0)`` index of each partition (a block's first tick is
    its oldest reading). Joined and grouped over a
    chunk instead, PostgreSQL scanned every sample of every partition for each chunk (a first
    pass over 100,000 new GPUs: 200 parallel scans of the whole table, measured in fleet-scale
    run 11)."""
    first = (
        select(func.min(gpu_sample_blocks.c.ts0))
        .where(gpu_sample_blocks.c.gpu_id == gpus.c.id)
        .correlate(gpus)
        .scalar_subquery()
    )
    out: dict[str, datetime] = {}
    for chunk in _chunks(uuids):
        give_way()
        query = select(gpus.c.uuid, first.label("first")).where(gpus.c.uuid.in_(chunk))
        out.update({row.uuid: row.first for row in conn.execute(query) if row.first is not None})
    return out


def _install(conn: Connection, new: Sequence[_Gpu], guard: ItemGuard) -> int:
    """Open lifetimes at each GPU's first reading, on the agent's clock like its failures (a
    simulated or late agent would otherwise get lifetimes that end before they start). In
    chunks, giving way between them: a new fleet's first pass opens 100,000 at once (33 s of
    the worker's interpreter in fleet-scale run 39, beside the urgent lane)."""
    if not new:
        return 0
    first = _first_samples(conn, [g.uuid for g in new])
    rows = [_opening(g, min(first.get(g.uuid, g.first_seen), g.first_seen)) for g in new]
    opened = 0
    for start in range(0, len(rows), _INSERT_CHUNK):
        give_way()
        opened += _insert(conn, rows[start : start + _INSERT_CHUNK], guard)
    return opened


def _insert(conn: Connection, rows: list[dict[str, Any]], guard: ItemGuard) -> int:
    # All at once; a row the database refuses is logged and skipped, the others are stored.
    return guard.many(
        conn,
        rows,
        lambda many: conn.execute(gpu_lifetimes.insert(), many),
        ident=lambda row: f"gpu {row['gpu_uuid']}",
    )


def _replacements(fleet: Iterable[_Gpu], open_observed: dict[str, _Stint]) -> dict[str, _Gpu]:
    """Serial key of each GPU with an open observed lifetime -> the GPU that took its slot."""
    by_slot: dict[tuple[int, str], list[_Gpu]] = defaultdict(list)
    for g in fleet:
        by_slot[g.slot].append(g)
    replaced: dict[str, _Gpu] = {}
    for occupants in by_slot.values():
        occupants.sort(key=lambda g: (g.first_seen, g.uuid))
        for g in occupants:
            if g.key not in open_observed:
                continue
            later = [n for n in occupants if n.key != g.key and n.first_seen >= g.last_seen]
            if later:
                replaced[g.key] = later[0]
    return replaced


def _fatal_verdicts(
    conn: Connection,
    candidates: Sequence[_Gpu],
    open_observed: dict[str, _Stint],
    catalog: XidCatalog,
    leave_after: timedelta,
) -> dict[str, _Fatal]:
    """Serial key -> the earliest fatal verdict in the 24 h before the GPU's last sighting."""
    by_uuid = {g.uuid: g for g in candidates}
    # Kernel-log Xids name the PCI address only: match those on the GPU's node and slot.
    by_slot = {g.slot: g.uuid for g in candidates}
    per_gpu: dict[str, list[Any]] = defaultdict(list)  # rows, read as XidEventLike
    for chunk in _chunks(list(by_uuid)):
        since = min(by_uuid[u].last_sample for u in chunk) - LOOKBACK
        node_ids = sorted({by_uuid[u].node_id for u in chunk})
        query = select(*_XID_EVENT_COLUMNS).where(
            events.c.node_id.in_(node_ids),
            events.c.kind.in_(("xid", "gpu_lost")),
            events.c.ts >= since,
        )
        for row in conn.execute(query):
            uuid = row.uuid if row.uuid else by_slot.get((row.node_id, row.pci_bus_id or ""))
            if uuid in by_uuid:
                per_gpu[uuid].append(row)
    planned: dict[str, list[tuple[datetime, datetime]]] = {}
    if per_gpu:
        times = [e.ts for evs in per_gpu.values() for e in evs]
        planned = maintenance_intervals(conn, min(times), max(times) + timedelta(seconds=1))
    found: dict[str, _Fatal] = {}
    for uuid, evs in per_gpu.items():
        g = by_uuid[uuid]
        floor = g.last_sample - LOOKBACK  # after a return, nothing from before the last removal:
        if (ended := open_observed[g.key].previous_end) is not None:
            floor = max(floor, ended + leave_after)
        spans = planned.get(g.node, [])
        evs = [
            e for e in evs if e.ts >= floor and not (e.kind == "gpu_lost" and _within(e.ts, spans))
        ]
        verdicts = judge_xids(evs, catalog=catalog, now=g.last_sample)
        fatal = [
            _from_verdict(v, catalog)
            for v in verdicts
            if v.counts_against_gpu and v.severity in _FATAL_SEVERITIES
        ]
        if lost := sorted(e.ts for e in evs if e.kind == "gpu_lost"):
            fatal.append(_lost_from_bus(lost))
        if fatal:
            found[g.key] = min(fatal, key=lambda f: f.at)
    return found


def _within(ts: datetime, spans: list[tuple[datetime, datetime]]) -> bool:
    return any(start <= ts <= stop for start, stop in spans)


def _from_verdict(v: XidVerdict, catalog: XidCatalog) -> _Fatal:
    assert v.first_seen is not None  # judge_xids stamps undated events with its ``now``
    primary = catalog.lookup(v.xids[0])
    folded = f" with Xid {', '.join(map(str, v.xids[1:]))}" if len(v.xids) > 1 else ""
    cause = f"Xid {v.xids[0]} ({primary.mnemonic}){folded} x{v.count}: rule {v.rule}, {v.action}"
    evidence = {
        "xids": list(v.xids),
        "count": v.count,
        "first_seen": v.first_seen.isoformat(),
        "action": v.action,
        "rule": v.rule,
        "source": v.source,
    }
    return _Fatal(v.first_seen, cause, evidence)


def _lost_from_bus(lost: list[datetime]) -> _Fatal:
    """A GPU's ``gpu_lost`` events (sorted) as a fatal finding at the first of them."""
    evidence = {
        "xids": [],
        "count": len(lost),
        "first_seen": lost[0].isoformat(),
        "action": "reboot_node",
        "rule": "gpu_lost",
        "source": "event",
    }
    return _Fatal(lost[0], "GPU lost from the bus (gpu_lost event)", evidence)


def _returns(
    conn: Connection,
    fleet: dict[str, _Gpu],
    newest: dict[str, _Stint],
    leave_after: timedelta,
    guard: ItemGuard,
) -> int:
    """Reopen serials whose newest lifetime was closed before this run yet report again."""
    back = {
        g.uuid: (g, row.removed_at + leave_after)
        for key, g in fleet.items()
        if (row := newest.get(key)) is not None
        and row.removed_at is not None
        and g.last_sample > row.removed_at + leave_after
    }
    rows = []
    for uuid, (g, grace_end) in back.items():
        gpu_id = conn.execute(select(gpus.c.id).where(gpus.c.uuid == uuid)).scalar_one()
        first = _first_sample_after(conn, gpu_id, grace_end)
        if first is not None:
            rows.append(_opening(g, first))
    return _insert(conn, rows, guard)


def _first_sample_after(conn: Connection, gpu_id: int, after: datetime) -> datetime | None:
    """The time of the GPU's oldest reading after ``after``. A block holds at most an hour, so
    the readings of the hour after ``after`` are decoded (blocks that began before it may hold
    some); past that hour, the oldest block that begins after it starts with the reading."""
    since = after + timedelta(microseconds=1)
    span = timedelta(microseconds=MAX_BLOCK_SPAN_US)
    for chunk in read_samples(conn, (), gpu_ids=[gpu_id], since=since, until=after + span):
        return from_us(int(chunk.ts_us.min()))  # chunks in order of first tick: the first holds it
    b = gpu_sample_blocks.c
    query = select(func.min(b.ts0)).where(b.gpu_id == gpu_id, b.ts0 > after)
    found: datetime | None = conn.execute(query).scalar()
    return found


def _chunks(items: list[str]) -> Iterator[list[str]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, _CHUNK)):
        yield chunk
