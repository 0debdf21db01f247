"""Kernel-log events beyond Xid, from the log file to the server's events API.

Fatal NVSwitch and PCIe errors leave at once, like a fatal Xid; corrected errors are kept in the
spool at once but wait for the next push; an AER record on one of the node's GPUs names it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from fleetwatch.agent.batching import is_critical, split_critical
from fleetwatch.agent.collectors.base import Collection
from fleetwatch.agent.collectors.kernel_log import KernelLogCollector
from fleetwatch.agent.event_gpus import attach_gpu_uuids
from fleetwatch.agent.kmsg import open_kernel_log
from fleetwatch.agent.loop import Agent
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import create_token
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample, NodeInfo

UUID = "GPU-00000000-1111-2222-3333-444444444444"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

FATAL_SXID = (
    "[ 20.1] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
)
CORRECTED_AER_ON_GPU = [
    "[ 30.1] pcieport 0000:3a:00.0: AER: Corrected error received: 0000:3b:00.0",
    "[ 30.2] nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "(Receiver ID)",
    "[ 30.3] nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00000001/0000e000",
    "[ 30.4] nvidia 0000:3b:00.0:    [ 0] RxErr",
]


class GpuCollector:
    """One GPU at 0000:3b:00.0, as nvidia-smi spells it."""

    name: ClassVar[str] = "gpu"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self, now: datetime) -> Collection:
        self.calls += 1
        return Collection(
            gpus=[GpuIdentity(uuid=UUID, index=0, pci_bus_id="00000000:3B:00.0")],
            samples=[GpuSample(uuid=UUID, ts=now, gpu_temp_c=40.0 + self.calls)],
        )

    def close(self) -> None:
        pass


class ListSource:
    """A kernel log whose lines a test appends."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def append(self, *lines: str) -> None:
        with self._lock:
            self.lines += lines

    def read_lines(self) -> list[str]:
        with self._lock:
            lines, self.lines = self.lines, []
        return lines

    def close(self) -> None:
        pass


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[TestClient, str, str]]:
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 's.db'}"))
    with TestClient(app) as client:
        with app.state.db.write() as conn:
            agent_token, _ = create_token(conn, name="a", scope="agent")
            read_token, _ = create_token(conn, name="r", scope="read")
        yield client, agent_token, read_token


def _agent(tmp_path: Path, client: TestClient, token: str, collectors: list[object]) -> Agent:
    client.headers["Authorization"] = f"Bearer {token}"
    spool = Spool(tmp_path / "spool")
    metrics = AgentMetrics()
    return Agent(
        node=NodeInfo(name="node-1", interval_s=3600, boot_id="b1"),
        collectors=collectors,  # type: ignore[arg-type]
        spool=spool,
        pusher=Pusher(client, spool, metrics, rejected_dir=tmp_path / "rejected"),
        metrics=metrics,
        clock=lambda: datetime.now(UTC),
    )


# -- what is critical -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "severity", "critical"),
    [
        ("sxid", "fatal", True),
        ("sxid", "non_fatal", False),
        ("sxid", None, False),
        ("pcie_aer", "fatal", True),
        ("pcie_aer", "non_fatal", False),
        ("pcie_aer", "corrected", False),
        ("mce", "fatal", False),  # the host is going down anyway; rules judge it (issue 13 item 4)
        ("edac", "uncorrected", False),
        ("gpu_lost", None, True),
    ],
)
def test_is_critical_by_kind_and_severity(kind: str, severity: str | None, critical: bool) -> None:
    details = {"severity": severity} if severity else None
    assert is_critical(Event(kind=kind, ts=T0, details=details)) is critical


def test_split_critical_keeps_order_within_each_part() -> None:
    events = [
        Event(kind="edac", ts=T0, details={"severity": "corrected", "count": 1}),
        Event(kind="sxid", ts=T0, details={"severity": "fatal"}),
        Event(kind="xid", ts=T0, xid=13),
        Event(kind="pcie_aer", ts=T0, details={"severity": "corrected"}),
    ]
    critical, routine = split_critical(events)
    assert [e.kind for e in critical] == ["sxid", "xid"]
    assert [e.kind for e in routine] == ["edac", "pcie_aer"]


# -- which GPU --------------------------------------------------------------------------------


def test_attach_gpu_uuids_matches_any_spelling_of_the_address_for_aer_only() -> None:
    gpus = [
        GpuIdentity(uuid=UUID, index=0, pci_bus_id="00000000:3B:00.0"),
        GpuIdentity(uuid="GPU-no-address", index=1),
    ]
    events = [
        Event(kind="pcie_aer", ts=T0, pci_bus_id="0000:3b:00.0"),
        Event(kind="pcie_aer", ts=T0, pci_bus_id="0000:3a:00.0"),  # the root port above it
        Event(kind="sxid", ts=T0, pci_bus_id="0000:3b:00.0"),  # a switch is never a GPU
        Event(kind="xid", ts=T0, xid=79, pci_bus_id="3b:00.0"),  # the server maps Xids
    ]
    out = attach_gpu_uuids(events, gpus)
    assert [e.uuid for e in out] == [UUID, None, None, None]
    assert attach_gpu_uuids(events, []) is events


# -- the collector ----------------------------------------------------------------------------


def test_watcher_pushes_fatal_at_once_and_hands_corrected_to_the_routine_sink() -> None:
    source = ListSource()
    collector = KernelLogCollector(source, clock=lambda: T0, poll_s=0.01)
    critical: queue.Queue[list[Event]] = queue.Queue()
    routine: queue.Queue[list[Event]] = queue.Queue()
    collector.routine_sink = routine.put
    collector.start_watch(critical.put)
    try:
        source.append(FATAL_SXID, *CORRECTED_AER_ON_GPU)
        (sxid,) = critical.get(timeout=60)
        (aer,) = routine.get(timeout=60)
    finally:
        collector.stop_watch()
    assert (sxid.kind, sxid.pci_bus_id, sxid.ts) == ("sxid", "0000:06:00.0", T0)
    assert sxid.details is not None and sxid.details["severity"] == "fatal"
    assert (aer.kind, aer.pci_bus_id) == ("pcie_aer", "0000:3b:00.0")
    assert aer.details is not None and aer.details["errors"] == ["RxErr"]
    assert critical.empty() and routine.empty()


def test_watcher_without_a_routine_sink_hands_everything_over_at_once() -> None:
    source = ListSource()
    collector = KernelLogCollector(source, clock=lambda: T0, poll_s=0.01)
    emitted: queue.Queue[list[Event]] = queue.Queue()
    collector.start_watch(emitted.put)
    try:
        source.append(*CORRECTED_AER_ON_GPU)
        (aer,) = emitted.get(timeout=60)
    finally:
        collector.stop_watch()
    assert aer.kind == "pcie_aer"


def test_a_record_the_wire_cannot_carry_is_left_out_and_the_watcher_goes_on() -> None:
    # A machine-check bank past 64 bits: the server would refuse the event (event_details).
    # Before, the ValidationError ended the watcher thread, and every later fatal Xid with it.
    source = ListSource()
    collector = KernelLogCollector(source, clock=lambda: T0, poll_s=0.01)
    emitted: queue.Queue[list[Event]] = queue.Queue()
    collector.start_watch(emitted.put)
    try:
        source.append(f"[ 12.5] mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank {'9' * 30}: 0")
        source.append(FATAL_SXID)
        (sxid,) = emitted.get(timeout=60)
    finally:
        collector.stop_watch()
    assert sxid.kind == "sxid"
    assert collector.bad_lines == 1


def test_collect_without_a_watcher_closes_records_at_the_end_of_the_read() -> None:
    source = ListSource()
    collector = KernelLogCollector(source, clock=lambda: T0)
    source.append(*CORRECTED_AER_ON_GPU, "[ 31.0] some other line", "garbage SXid (PCI:zz")
    events = collector.collect(T0).events
    assert [e.kind for e in events] == ["pcie_aer"]
    assert collector.bad_lines == 1


# -- the agent --------------------------------------------------------------------------------


def test_routine_events_from_a_watcher_are_staged_when_batching(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, _ = server
    agent = _agent(tmp_path, client, agent_token, [GpuCollector()])
    agent.node = NodeInfo(name="node-1", interval_s=10, boot_id="b1")
    agent.push_interval_s = 60
    agent.emit_routine([Event(kind="edac", ts=T0, details={"severity": "corrected", "count": 2})])
    # Kept durably, but it does not count as a collection, so it does not hasten the push.
    assert agent._spool.staged()[0] == 1
    assert agent._spool.staged_collections() == 0
    assert agent.spool_depth()[0] == 0
    # A fatal error handed to the routine path by mistake still leaves at once.
    agent.emit_routine([Event(kind="sxid", ts=T0, details={"severity": "fatal"})])
    assert agent.spool_depth()[0] == 1
    assert agent._spool.staged()[0] == 1


def test_fatal_sxid_reaches_the_server_before_the_next_tick_and_aer_names_the_gpu(
    tmp_path: Path, server: tuple[TestClient, str, str]
) -> None:
    client, agent_token, read_token = server
    log = tmp_path / "kern.log"
    log.write_text("")
    kernel = KernelLogCollector(
        open_kernel_log(str(log), tmp_path / "state"), clock=lambda: datetime.now(UTC), poll_s=0.05
    )
    gpus = GpuCollector()
    agent = _agent(tmp_path, client, agent_token, [gpus, kernel])
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    auth = {"Authorization": f"Bearer {read_token}"}

    def stored(kind: str) -> list[dict[str, object]]:
        found: list[dict[str, object]] = client.get(
            "/v1/events", params={"kind": kind}, headers=auth
        ).json()["data"]
        return found

    try:
        _until(lambda: client.get(f"/v1/gpus/{UUID}", headers=auth).status_code == 200)
        with log.open("a") as f:
            f.write("\n".join([FATAL_SXID, *CORRECTED_AER_ON_GPU]) + "\n")
        _until(lambda: bool(stored("sxid")) and bool(stored("pcie_aer")))
    finally:
        stop.set()
        runner.join(timeout=60)
    assert gpus.calls == 1  # ticks an hour apart: both left without waiting for a tick
    (sxid,) = stored("sxid")
    (aer,) = stored("pcie_aer")
    assert (sxid["pci_bus_id"], sxid["gpu_uuid"], sxid["node"]) == ("0000:06:00.0", None, "node-1")
    assert sxid["details"] == {
        "sxid": 20034,
        "severity": "fatal",
        "severity_from": "line",
        "catalog_class": "fatal",
        "catalog_name": "LTSSM Fault Up",
        "link": 48,
        "error": "LTSSM Fault Up",
        "first": False,
        "switch": "nvidia-nvswitch1",
        "source": "kernel",
    }
    assert (aer["pci_bus_id"], aer["gpu_uuid"]) == ("0000:3b:00.0", UUID)
    assert aer["details"]["severity"] == "corrected"  # type: ignore[index]
    assert aer["details"]["reported_by"] == "0000:3a:00.0"  # type: ignore[index]
