"""Judge a node's recent Xid events: the catalogue's table plus the history rules it asks for.

:func:`judge_xids` is pure: events in, :class:`XidVerdict` list out, time from ``now``. Per GPU
(keyed by PCI bus id, or UUID when that is all an event has) it applies, in order:

1. **Follow-ons** - an Xid 94/95 within ``follow_on_window`` after a 48/79 on the same GPU is the
   sympathetic report of that fault (NVIDIA: "IGNORE (sympathetic)"), folded into its verdict.
2. **Flood control** - events of one Xid on one GPU whose gaps are at most ``flood_window`` form
   one burst and one verdict with a count (Xid 95 can flood 800K lines, NVS#1120).
3. Per-code rules: ``xid48_with_remap`` (48 with 63/64 within ``remap_window`` -> drain and
   reset; 171/172 folded in as detail) or ``xid48_solo`` (reset); ``xid13_repeat`` /
   ``xid31_repeat`` (>= ``repeat_threshold`` bursts in ``lookback`` -> investigate, counts) or
   ``xid13_app`` / ``xid31_app`` (solo: application, does not count); ``xid74_nvlink`` (drain and
   inspect); ``xid79_off_bus`` (reboot node, drain); ``xid163_cancelled`` (a later 162 re-engaged
   power smoothing); ``catalog`` / ``unknown_xid`` otherwise.
4. **Xid 45** - a cleanup burst near another verdict is folded into it (follow the other Xid);
   alone it is ``xid45_solo`` (no action; restart Fabric Manager if it persists).
5. **Recovery action** - the driver's own verdict (latest Xid 154 "to 0xN", or NVML
   ``GPU_RECOVERY_ACTION`` passed in ``recovery_actions``) overrides the table: the GPU's verdicts
   that count against it merge into one ``xid154_recovery_action`` / ``nvml_recovery_action``
   verdict with the driver's action. Value 0 (NONE) overrides nothing, since a polled 0 is also
   the idle state and must not hide a fresh fault.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from fleetwatch.rules.xid_catalog import SEVERITY_RANK, Action, Severity, XidCatalog, XidEntry

# XidCatalog and XidEntry are re-exported so callers need one import for the whole judge.
__all__ = [
    "RECOVERY_ACTIONS",
    "XidCatalog",
    "XidEntry",
    "XidEventLike",
    "XidVerdict",
    "judge_xids",
    "may_take_gpu_out",
]

# NVML nvmlGpuRecoveryAction_t (also DCGM field 1523 and the "to 0xN" of Xid 154).
RECOVERY_ACTIONS: dict[int, tuple[str, Action, Severity]] = {
    0: ("NONE", "none", "info"),
    1: ("GPU_RESET", "reset_gpu", "critical"),
    2: ("NODE_REBOOT", "reboot_node", "critical"),
    3: ("DRAIN_P2P", "drain_inspect", "critical"),
    4: ("DRAIN_AND_RESET", "drain_reset", "critical"),
}
_RECOVERY_RE = re.compile(r"\bto\s+0x([0-9a-fA-F]+)")
_FOLLOWED = frozenset({48, 79})
_SYMPATHETIC = frozenset({94, 95})
_REMAP = frozenset({63, 64})
_ECC_DETAIL = frozenset({171, 172})
_REPEATING = frozenset({13, 31})
_MAX_TIMESTAMPS = 20  # evidence keeps the first few stamps; the counts keep the rest


class XidEventLike(Protocol):
    """What the rules read from an event: :class:`fleetwatch.telemetry.Event` or a parser's
    ``KernelEvent``. ``uuid``, ``pid`` and ``process`` are read when present."""

    @property
    def kind(self) -> str: ...
    @property
    def xid(self) -> int | None: ...
    @property
    def ts(self) -> datetime | None: ...
    @property
    def pci_bus_id(self) -> str | None: ...
    @property
    def message(self) -> str | None: ...


@dataclass(frozen=True)
class XidVerdict:
    """One decision about one GPU, with the rule that made it and the events behind it."""

    gpu: str  # PCI bus id, else UUID
    uuid: str | None
    pci_bus_id: str | None
    xids: tuple[int, ...]  # the primary code first, then codes folded in
    action: Action
    severity: Severity
    counts_against_gpu: bool
    rule: str
    source: str
    known: bool
    count: int  # events of the primary code(s), flood included
    first_seen: datetime | None
    last_seen: datetime | None
    timestamps: tuple[datetime, ...]  # the first few, in order
    event_counts: Mapping[int, int]  # every folded event, per Xid
    follow_ons: Mapping[int, int] = field(default_factory=dict)  # sympathetic/cleanup, per Xid
    processes: tuple[str, ...] = ()
    note: str = ""


@dataclass
class _Ev:
    xid: int
    ts: datetime
    uuid: str | None
    pid: int | None
    process: str | None
    message: str


@dataclass
class _Group:
    """Events being folded into one verdict."""

    primary: list[_Ev]
    entry: XidEntry
    rule: str
    action: Action
    severity: Severity
    counts: bool
    extra: list[_Ev] = field(default_factory=list)  # folded-in codes that count as primary
    follow: list[_Ev] = field(default_factory=list)
    note: str = ""

    @property
    def start(self) -> datetime:
        return min(e.ts for e in self.primary + self.extra)

    @property
    def end(self) -> datetime:
        return max(e.ts for e in self.primary + self.extra)


_OUT_SEVERITIES = frozenset({"critical", "fatal"})


def may_take_gpu_out(xid: int | None, catalog: XidCatalog) -> bool:
    """Whether an Xid ``xid`` may, on arrival, make :func:`judge_xids` say a GPU must leave
    service: worth judging its node at once rather than at the next whole-fleet pass.

    No rule raises a verdict above the severity of the catalogue's entry for its primary code
    (a repeat of 13 or 31 keeps it; a follow-on or a cleanup Xid 45 folds into a verdict that
    woke the lane on its own), except Xid 154, whose severity is the driver's recovery action
    in its message. So an Xid is urgent when its entry (the fleet's overrides included) is
    critical or fatal, when the catalogue does not know it (nothing says it is harmless),
    when it is 154, or when it has no code. Application Xids (13, 31, 43, ...) are the bulk of
    a busy fleet's Xids and are not: they wait for the routine pass, as does a recovery action
    NVML reports, which comes with the samples rather than as an event.
    """
    if xid is None or xid == 154:
        return True
    entry = catalog.lookup(xid)
    return not entry.known or entry.severity in _OUT_SEVERITIES


def judge_xids(
    events: Iterable[XidEventLike],
    *,
    catalog: XidCatalog,
    now: datetime,
    lookback: timedelta = timedelta(hours=24),
    flood_window: timedelta = timedelta(seconds=60),
    follow_on_window: timedelta = timedelta(seconds=10),
    remap_window: timedelta = timedelta(seconds=60),
    cleanup_window: timedelta = timedelta(seconds=60),
    repeat_threshold: int = 2,
    recovery_actions: Mapping[str, int] | None = None,
) -> list[XidVerdict]:
    """Verdicts for the Xid events of the last ``lookback`` before ``now``, ordered by time.

    Events without a time (monotonic dmesg stamps) are taken as happening at ``now``: the
    caller passed them as recent. ``recovery_actions`` maps a GPU's PCI bus id or UUID to its
    NVML ``GPU_RECOVERY_ACTION`` value.
    """
    per_gpu, uuids = _by_gpu(events, now, now - lookback)
    for key in recovery_actions or {}:
        per_gpu.setdefault(uuids.get(key, key), [])
    verdicts: list[XidVerdict] = []
    for gpu, evs in per_gpu.items():
        evs.sort(key=lambda e: e.ts)
        groups = _judge_gpu(
            evs,
            catalog,
            flood_window,
            follow_on_window,
            remap_window,
            cleanup_window,
            repeat_threshold,
        )
        nvml = _nvml_action(recovery_actions or {}, gpu, uuids)
        groups = _apply_recovery(groups, evs, nvml, catalog)
        verdicts.extend(_verdict(gpu, g) for g in groups)
    verdicts.sort(key=lambda v: (v.first_seen or now, v.gpu, v.xids))
    return verdicts


def _by_gpu(
    events: Iterable[XidEventLike], now: datetime, since: datetime
) -> tuple[dict[str, list[_Ev]], dict[str, str]]:
    """Xid events per GPU key, and uuid -> key so UUID-only events land on the right GPU."""
    wanted = [e for e in events if e.kind == "xid" and e.xid is not None]
    uuids: dict[str, str] = {}
    for e in wanted:
        uuid = getattr(e, "uuid", None)
        if uuid and e.pci_bus_id:
            uuids[uuid] = e.pci_bus_id
    per_gpu: dict[str, list[_Ev]] = defaultdict(list)
    for e in wanted:
        ts = e.ts if e.ts is not None else now
        if ts < since:  # later than now is kept: a node clock may run ahead of the server's
            continue
        uuid = getattr(e, "uuid", None)
        key = e.pci_bus_id or (uuids.get(uuid, uuid) if uuid else None) or "unknown"
        assert e.xid is not None  # filtered above; mypy cannot see through the comprehension
        pid, process = getattr(e, "pid", None), getattr(e, "process", None)
        per_gpu[key].append(_Ev(e.xid, ts, uuid, pid, process, e.message or ""))
    return per_gpu, uuids


def _judge_gpu(
    evs: Sequence[_Ev],
    catalog: XidCatalog,
    flood_window: timedelta,
    follow_on_window: timedelta,
    remap_window: timedelta,
    cleanup_window: timedelta,
    repeat_threshold: int,
) -> list[_Group]:
    follow_of: dict[int, int] = {}  # index of a 94/95 -> index of the 48/79 it follows
    primaries = [i for i, e in enumerate(evs) if e.xid in _FOLLOWED]
    for i, e in enumerate(evs):
        if e.xid in _SYMPATHETIC:
            near = [p for p in primaries if timedelta(0) <= e.ts - evs[p].ts <= follow_on_window]
            if near:
                follow_of[i] = near[-1]
    bursts = _bursts([(i, e) for i, e in enumerate(evs) if i not in follow_of], flood_window)
    by_code: dict[int, list[list[int]]] = defaultdict(list)
    for burst in bursts:
        by_code[evs[burst[0]].xid].append(burst)

    groups: list[_Group] = []
    owner: dict[int, _Group] = {}  # event index -> its group, for follow-ons
    used: set[int] = set()  # codes 63/64/171/172 bursts folded into a 48

    def add(burst: list[int], group: _Group) -> None:
        groups.append(group)
        for i in burst:
            owner[i] = group

    for burst in by_code.pop(48, []):
        g = _group(evs, burst, catalog.lookup(48), "xid48_solo")
        for code in sorted(_REMAP | _ECC_DETAIL):
            for other in by_code.get(code, []):
                if id(other) not in used and _near(evs, burst, other, remap_window):
                    used.add(id(other))
                    g.extra.extend(evs[i] for i in other)
                    if code in _REMAP:
                        g.rule, g.action = "xid48_with_remap", "drain_reset"
        add(burst, g)
    for code in sorted(by_code):
        if code in _REPEATING and len(by_code[code]) >= repeat_threshold:
            # One verdict for the whole repeat: the escalation is about the GPU, not each burst.
            by_code[code] = [[i for burst in by_code[code] for i in burst]]
            add(by_code[code][0], _repeat_group(evs, by_code[code][0], code, catalog))
            continue
        for burst in by_code[code]:
            if id(burst) in used or code == 45:
                continue
            add(burst, _code_group(evs, burst, code, catalog, by_code))
    for i, p in follow_of.items():
        owner[p].follow.append(evs[i])
    for burst in by_code.get(45, []):
        hosts = [g for g in groups if _near_group(evs, burst, g, cleanup_window)]
        if hosts:
            hosts[0].follow.extend(evs[i] for i in burst)
        else:
            g = _group(evs, burst, catalog.lookup(45), "xid45_solo")
            g.note = "cleanup with no other Xid: restart Fabric Manager if it persists"
            groups.append(g)
    return groups


def _code_group(
    evs: Sequence[_Ev],
    burst: list[int],
    code: int,
    catalog: XidCatalog,
    by_code: Mapping[int, list[list[int]]],
) -> _Group:
    entry = catalog.lookup(code)
    if not entry.known:
        return _group(evs, burst, entry, "unknown_xid")
    if code in _REPEATING:
        return _group(evs, burst, entry, f"xid{code}_app")
    if code == 74:
        return _group(evs, burst, entry, "xid74_nvlink", action="drain_inspect")
    if code == 79:
        g = _group(evs, burst, entry, "xid79_off_bus", action="reboot_node")
        g.note = "drain the node, then reboot; hardware inspection if it returns"
        return g
    if code == 163:
        last = evs[burst[-1]].ts
        if any(evs[b[0]].ts > last for b in by_code.get(162, [])):
            g = _group(evs, burst, entry, "xid163_cancelled", action="none")
            g.severity, g.counts = "info", False
            return g
    return _group(evs, burst, entry, "catalog")


def _repeat_group(evs: Sequence[_Ev], events: list[int], code: int, catalog: XidCatalog) -> _Group:
    entry = catalog.lookup(code)
    g = _group(evs, events, entry, f"xid{code}_repeat")
    g.action, g.counts = "investigate", True
    g.severity = "warning" if entry.severity == "info" else entry.severity
    g.note = "repeats on this GPU: run DCGM diagnostics (EUD), then field diagnostics"
    return g


def _group(
    evs: Sequence[_Ev], burst: list[int], entry: XidEntry, rule: str, action: Action | None = None
) -> _Group:
    return _Group(
        primary=[evs[i] for i in burst],
        entry=entry,
        rule=rule,
        action=action or entry.action,
        severity=entry.severity,
        counts=entry.counts_against_gpu,
    )


def _bursts(indexed: list[tuple[int, _Ev]], window: timedelta) -> list[list[int]]:
    """Runs of one code whose consecutive gaps are <= window (a flood chains into one burst)."""
    open_: dict[int, list[int]] = {}
    last: dict[int, datetime] = {}
    out: list[list[int]] = []
    for i, e in indexed:
        if e.xid not in open_ or e.ts - last[e.xid] > window:
            open_[e.xid] = [i]
            out.append(open_[e.xid])
        else:
            open_[e.xid].append(i)
        last[e.xid] = e.ts
    return out


def _near(evs: Sequence[_Ev], a: list[int], b: list[int], window: timedelta) -> bool:
    a0, a1, b0, b1 = evs[a[0]].ts, evs[a[-1]].ts, evs[b[0]].ts, evs[b[-1]].ts
    return b0 - a1 <= window and a0 - b1 <= window


def _near_group(evs: Sequence[_Ev], burst: list[int], g: _Group, window: timedelta) -> bool:
    b0, b1 = evs[burst[0]].ts, evs[burst[-1]].ts
    return b0 - g.end <= window and g.start - b1 <= window


def _nvml_action(actions: Mapping[str, int], gpu: str, uuids: Mapping[str, str]) -> int | None:
    for key, value in actions.items():
        if key == gpu or uuids.get(key) == gpu:
            return value
    return None


def _apply_recovery(
    groups: list[_Group], evs: Sequence[_Ev], nvml: int | None, catalog: XidCatalog
) -> list[_Group]:
    """The driver's recovery action overrides the table for the verdicts that count."""
    x154 = [e for e in evs if e.xid == 154]
    value, rule = nvml, "nvml_recovery_action"
    parsed = [m for e in x154 if (m := _RECOVERY_RE.search(e.message))]
    if parsed:
        value, rule = int(parsed[-1].group(1), 16), "xid154_recovery_action"
    if not value or value not in RECOVERY_ACTIONS:
        return groups
    name, action, severity = RECOVERY_ACTIONS[value]
    own = [g for g in groups if g.entry.xid == 154]
    merged = [g for g in groups if g.counts and g not in own]
    kept = [g for g in groups if g not in own and g not in merged]
    entry = catalog.lookup(154)
    out = _Group(
        primary=[e for g in own for e in g.primary],
        entry=entry,
        rule=rule,
        action=action,
        severity=max([severity, *(g.severity for g in merged)], key=SEVERITY_RANK.__getitem__),
        counts=True,
        extra=[e for g in merged for e in g.primary + g.extra],
        follow=[e for g in merged + own for e in g.follow],
        note=f"driver recovery action {value} ({name}) overrides "
        + (", ".join(sorted({g.rule for g in merged})) or "the table"),
    )
    if rule == "nvml_recovery_action":
        out.note += "; from NVML GPU_RECOVERY_ACTION"
    return [*kept, out]


def _verdict(gpu: str, g: _Group) -> XidVerdict:
    is_uuid = gpu.startswith(("GPU-", "MIG-"))
    pci = None if is_uuid or gpu == "unknown" else gpu
    main = sorted(g.primary + g.extra, key=lambda e: e.ts)
    everything = main + g.follow
    xids = list(dict.fromkeys(e.xid for e in g.primary))
    xids += sorted({e.xid for e in g.extra} - set(xids))
    xids += sorted({e.xid for e in g.follow} - set(xids))
    uuid = next((e.uuid for e in everything if e.uuid), gpu if is_uuid else None)
    source = g.entry.source
    if g.rule == "nvml_recovery_action":
        source = "NVML GPU_RECOVERY_ACTION (overrides the table)"
    return XidVerdict(
        gpu=gpu,
        uuid=uuid,
        pci_bus_id=pci,
        xids=tuple(xids),
        action=g.action,
        severity=g.severity,
        counts_against_gpu=g.counts,
        rule=g.rule,
        source=source,
        known=g.entry.known,
        count=len(main),
        first_seen=main[0].ts if main else None,
        last_seen=main[-1].ts if main else None,
        timestamps=tuple(e.ts for e in main[:_MAX_TIMESTAMPS]),
        event_counts=dict(Counter(e.xid for e in everything)),
        follow_ons=dict(Counter(e.xid for e in g.follow)),
        processes=tuple(dict.fromkeys(e.process for e in everything if e.process)),
        note=g.note,
    )
