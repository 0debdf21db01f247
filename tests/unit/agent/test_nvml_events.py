"""NvmlCollector as a Watcher: NVML event-set events (Xid, ECC) emitted the moment they happen."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.nvml import Nvml
from fleetwatch.telemetry import Event
from fleetwatch.testing import FakePynvml

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
H100_0 = "GPU-4f3a1c00-7c2d-4b3a-9f8e-1d2c3b4a5e60"
H100_6 = "GPU-4f3a1c06-7c2d-4b3a-9f8e-1d2c3b4a5e66"


@pytest.fixture
def h100() -> FakePynvml:
    return FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")


@pytest.fixture
def emitted() -> queue.Queue[list[Event]]:
    return queue.Queue()


@pytest.fixture
def watching(h100: FakePynvml, emitted: queue.Queue[list[Event]]) -> Iterator[NvmlCollector]:
    collector = NvmlCollector(Nvml(h100), event_timeout_ms=100)
    collector.start_watch(emitted.put)
    wait_until(lambda: all(h100.registered_event_types(i) for i in range(8)))
    yield collector
    collector.close()


def wait_until(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_nvml_watcher_emits_an_injected_xid_without_a_collection(
    h100: FakePynvml, watching: NvmlCollector, emitted: queue.Queue[list[Event]]
) -> None:
    before = datetime.now(UTC)
    h100.inject_xid(6, 79)

    [event] = emitted.get(timeout=60)  # delivered by the watcher thread: nobody calls collect()

    assert (event.kind, event.xid, event.uuid, event.pci_bus_id) == (
        "xid",
        79,
        H100_6,
        "0000:ba:00.0",
    )
    assert event.message == "NVML Xid critical error event"
    assert before <= event.ts <= datetime.now(UTC)


def test_nvml_watcher_registers_xid_and_dbe_but_not_sbe(
    h100: FakePynvml, watching: NvmlCollector, emitted: queue.Queue[list[Event]]
) -> None:
    assert h100.registered_event_types(0) == (
        h100.nvmlEventTypeXidCriticalError | h100.nvmlEventTypeDoubleBitEccError
    )
    h100.inject_event(0, h100.nvmlEventTypeSingleBitEccError)  # not registered: never delivered
    h100.inject_event(0, h100.nvmlEventTypeDoubleBitEccError)

    [event] = emitted.get(timeout=60)
    assert (event.kind, event.uuid, event.xid) == ("ecc_dbe", H100_0, None)
    assert event.message == "NVML double-bit ECC error event"
    assert emitted.empty()


def test_nvml_watcher_stops_cleanly_and_frees_its_event_set(h100: FakePynvml) -> None:
    collector = NvmlCollector(Nvml(h100), event_timeout_ms=500)
    collector.start_watch(lambda events: None)
    wait_until(lambda: h100.registered_event_types(0))

    collector.stop_watch()  # returns once the wait in progress times out (the thread is joined)

    assert not any(t.name == "fleetwatch-nvml-events" for t in threading.enumerate())
    assert h100.calls["nvmlEventSetFree"] == 1
    assert h100.registered_event_types(0) == 0
    collector.close()
    assert h100.calls["nvmlShutdown"] == 1


def test_nvml_watcher_skips_a_gpu_without_event_support(
    h100: FakePynvml, emitted: queue.Queue[list[Event]], caplog: pytest.LogCaptureFixture
) -> None:
    h100.set_value(2, "supported_event_types", 0)
    h100.set_unsupported(3, "nvmlDeviceRegisterEvents")
    collector = NvmlCollector(Nvml(h100), event_timeout_ms=100)
    collector.start_watch(emitted.put)
    wait_until(lambda: h100.registered_event_types(7))

    h100.inject_xid(2, 13)
    h100.inject_xid(4, 31)
    [event] = emitted.get(timeout=60)
    collector.close()

    assert (event.xid, event.uuid) == (31, "GPU-4f3a1c04-7c2d-4b3a-9f8e-1d2c3b4a5e64")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("index 2) offers no Xid/ECC events" in m for m in warned)
    assert any("GPU index 3: no NVML events" in m for m in warned)


def test_nvml_watcher_survives_a_failing_wait_and_warns_once(
    h100: FakePynvml,
    watching: NvmlCollector,
    emitted: queue.Queue[list[Event]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    h100.event_wait_error = h100.NVML_ERROR_GPU_IS_LOST
    wait_until(lambda: watching.errors[("nvml", "event_wait")] >= 2)
    h100.event_wait_error = None
    h100.inject_xid(1, 94)

    [event] = emitted.get(timeout=60)
    assert event.xid == 94
    warned = [r for r in caplog.records if "waiting for NVML events failed" in r.getMessage()]
    assert len(warned) == 1


def test_nvml_close_waits_for_an_event_wait_in_progress(h100: FakePynvml) -> None:
    waiting = threading.Event()
    shut_down_mid_wait: list[bool] = []
    real_wait, real_shutdown = h100.nvmlEventSetWait_v2, h100.nvmlShutdown

    def wait(eventSet: object, timeoutms: int) -> object:
        waiting.set()
        try:
            return real_wait(eventSet, timeoutms)  # type: ignore[arg-type]
        finally:
            waiting.clear()

    def shutdown() -> None:
        shut_down_mid_wait.append(waiting.is_set())
        real_shutdown()

    h100.nvmlEventSetWait_v2 = wait  # type: ignore[method-assign,assignment]
    h100.nvmlShutdown = shutdown  # type: ignore[method-assign]
    nvml = Nvml(h100).open()
    stop = threading.Event()
    seen: list[Event] = []
    thread = threading.Thread(target=lambda: seen.extend(nvml.watch_events(stop, timeout_ms=200)))
    thread.start()
    wait_until(waiting.is_set)

    nvml.close()  # must not shut NVML down under a thread blocked in nvmlEventSetWait_v2
    thread.join(timeout=60)

    assert not thread.is_alive()
    assert shut_down_mid_wait == [False]
    assert seen == []
