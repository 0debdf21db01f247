"""POST /v1/ingest, then the read API: what a valid batch becomes, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database

Read = Callable[..., httpx.Response]


def _iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _batch_of(node: str, samples: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """A batch of one GPU (index 0 of ``node``) with exactly these samples."""
    batch = make_batch(node, gpus=1, **kwargs)
    batch["samples"] = samples
    return batch


# -- stored and readable ---------------------------------------------------------------------


def test_ingest_valid_batch_is_readable_back(push: Push, read: Read, db: Database) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    batch = make_batch("node-a", gpus=2, ticks=3, start=start)
    _ok(push(batch))
    assert row_counts(db) == {
        "nodes": 1,
        "gpus": 2,
        "gpu_samples": 6,
        "events": 0,
        "ingest_batches": 1,
    }
    uuid = batch["gpus"][1]["uuid"]

    gpu = read(f"/v1/gpus/{uuid}").json()
    assert gpu["node"] == "node-a" and gpu["index"] == 1
    assert gpu["serial"] == batch["gpus"][1]["serial"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    newest = batch["samples"][-1]
    assert _iso(gpu["latest"]["ts"]) == _iso(newest["ts"])
    expected = {k: v for k, v in newest.items() if k not in ("uuid", "ts")}
    assert gpu["latest"]["values"] == expected

    samples = read(f"/v1/gpus/{uuid}/samples").json()
    assert samples["count"] == 3
    mine = [s for s in batch["samples"] if s["uuid"] == uuid]
    assert [_iso(p["ts"]) for p in samples["data"]] == [_iso(s["ts"]) for s in mine]
    assert all(p["boot_id"] == "boot-1" for p in samples["data"])
    assert samples["data"][0]["values"]["power_w"] == 312.5
    assert samples["data"][0]["values"]["energy_mj"] == 123_456_789
    assert samples["rates"] is None

    node = read("/v1/nodes/node-a").json()
    assert node["gpu_count"] == 2 and node["state"] == "up" and node["boot_id"] == "boot-1"
    assert node["labels"] == {"cluster": "test", "rack": "r1"}
    assert [g["uuid"] for g in node["gpus"]] == [g["uuid"] for g in batch["gpus"]]


def test_ingest_samples_fields_filter_returns_only_those(push: Push, read: Read) -> None:
    batch = make_batch("node-a", gpus=1, ticks=2)
    _ok(push(batch))
    uuid = batch["gpus"][0]["uuid"]
    data = read(f"/v1/gpus/{uuid}/samples", fields="gpu_temp_c,power_w").json()
    assert data["fields"] == ["gpu_temp_c", "power_w"]
    assert [p["values"] for p in data["data"]] == [{"gpu_temp_c": 41.0, "power_w": 312.5}] * 2


def test_ingest_partial_sample_leaves_other_fields_absent(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    ts = datetime.now(UTC) - timedelta(seconds=5)
    sample = {
        "uuid": uuid,
        "ts": ts.isoformat(),
        "gpu_temp_c": 55.5,
        "retired_pages_pending": False,
    }
    _ok(push(_batch_of("node-a", [sample])))

    latest = read(f"/v1/gpus/{uuid}").json()["latest"]["values"]
    # False is a reading ("no retirement pending"), not an absence; nothing else was reported.
    assert latest == {"gpu_temp_c": 55.5, "retired_pages_pending": False}
    points = read(f"/v1/gpus/{uuid}/samples").json()["data"]
    assert [p["values"] for p in points] == [latest]
    listed = read("/v1/gpus").json()
    assert listed[0]["latest"]["values"] == latest


def test_ingest_zero_counter_is_stored_as_zero_not_absent(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    sample = {"uuid": uuid, "ts": datetime.now(UTC).isoformat(), "ecc_dbe_volatile_total": 0}
    _ok(push(_batch_of("node-a", [sample])))
    assert read(f"/v1/gpus/{uuid}").json()["latest"]["values"] == {"ecc_dbe_volatile_total": 0}


def test_ingest_pci_bus_id_is_normalised(push: Push, read: Read) -> None:
    batch = make_batch("node-a", gpus=1)
    batch["gpus"][0]["pci_bus_id"] = "00000000:3B:00.0"
    _ok(push(batch))
    gpu = read(f"/v1/gpus/{batch['gpus'][0]['uuid']}").json()
    assert gpu["pci_bus_id"] == "0000:3b:00.0"


def test_ingest_event_with_only_pci_bus_id_is_mapped_to_the_gpu(push: Push, read: Read) -> None:
    batch = make_batch("node-a", gpus=2)
    batch["gpus"][1]["pci_bus_id"] = "0000:3b:00.0"
    batch["events"] = [
        {
            "kind": "xid",
            "xid": 79,
            "pci_bus_id": "00000000:3B:00.0",
            "ts": datetime.now(UTC).isoformat(),
            "message": "GPU has fallen off the bus.",
        }
    ]
    assert _ok(push(batch))["accepted"] == {"samples": 2, "events": 1}
    found = read("/v1/events", kind="xid").json()["data"]
    assert len(found) == 1
    assert found[0]["gpu_uuid"] == batch["gpus"][1]["uuid"]
    assert found[0]["pci_bus_id"] == "0000:3b:00.0"
    assert found[0]["xid"] == 79 and found[0]["node"] == "node-a"
    recent = read(f"/v1/gpus/{batch['gpus'][1]['uuid']}").json()["recent_events"]
    assert [e["xid"] for e in recent] == [79]


def test_ingest_pci_event_in_a_later_batch_maps_through_stored_inventory(
    push: Push, read: Read
) -> None:
    _ok(push(make_batch("node-a", gpus=2)))
    later = make_batch("node-a", gpus=0)
    later["events"] = [
        {"kind": "gpu_lost", "pci_bus_id": "19:00.0", "ts": datetime.now(UTC).isoformat()}
    ]
    _ok(push(later))
    found = read("/v1/events", kind="gpu_lost").json()["data"]
    assert [e["gpu_uuid"] for e in found] == [gpu_uuid("node-a", 1)]


def test_ingest_event_for_an_unknown_pci_slot_keeps_no_gpu(push: Push, read: Read) -> None:
    batch = make_batch("node-a", gpus=1)
    batch["events"] = [
        {"kind": "gpu_lost", "pci_bus_id": "0000:ee:00.0", "ts": datetime.now(UTC).isoformat()}
    ]
    _ok(push(batch))
    found = read("/v1/events", kind="gpu_lost").json()["data"]
    assert found[0]["gpu_uuid"] is None and found[0]["pci_bus_id"] == "0000:ee:00.0"


# -- reboots and counter resets --------------------------------------------------------------


def test_ingest_boot_id_change_records_a_node_boot_event(push: Push, read: Read) -> None:
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-1")))
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-1")))
    assert read("/v1/events", kind="node_boot").json()["count"] == 0

    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-2")))
    boots = read("/v1/events", kind="node_boot").json()["data"]
    assert len(boots) == 1
    assert boots[0]["node"] == "node-a"
    assert boots[0]["details"] == {"previous_boot_id": "boot-1", "boot_id": "boot-2"}
    assert read("/v1/nodes/node-a").json()["boot_id"] == "boot-2"


def test_ingest_duplicate_after_reboot_records_no_second_boot(push: Push, read: Read) -> None:
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-1")))
    rebooted = make_batch("node-a", gpus=1, boot_id="boot-2")
    _ok(push(rebooted))
    assert _ok(push(rebooted))["duplicate"] is True
    assert read("/v1/events", kind="node_boot").json()["count"] == 1


def test_ingest_late_batch_from_before_a_reboot_does_not_switch_the_boot_back(
    push: Push, read: Read
) -> None:
    # A node reboots while the server is down; its spool replays a critical batch of the new
    # boot first, then the old boot's routine batches.
    now = datetime.now(UTC)
    old = make_batch("node-a", gpus=1, boot_id="boot-1", start=now - timedelta(minutes=10))
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-1", start=now - timedelta(minutes=20))))
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-2", start=now - timedelta(minutes=1))))
    _ok(push(old))
    boots = read("/v1/events", kind="node_boot").json()["data"]
    assert [b["details"]["boot_id"] for b in boots] == ["boot-2"]
    assert read("/v1/nodes/node-a").json()["boot_id"] == "boot-2"
    # The old batch's samples are still stored, under the boot they were read in.
    uuid = old["gpus"][0]["uuid"]
    stored = read(f"/v1/gpus/{uuid}/samples").json()["data"]
    assert [p["boot_id"] for p in stored] == ["boot-1", "boot-1", "boot-2"]


def test_ingest_first_boot_id_fills_in_without_a_node_boot_event(push: Push, read: Read) -> None:
    # An agent that could not read its boot id at first, then could; then could not again.
    without = make_batch("node-a", gpus=1)
    del without["node"]["boot_id"]
    _ok(push(without))
    assert read("/v1/nodes/node-a").json()["boot_id"] is None
    _ok(push(make_batch("node-a", gpus=1, boot_id="boot-1")))
    assert read("/v1/nodes/node-a").json()["boot_id"] == "boot-1"
    again_without = make_batch("node-a", gpus=1)
    del again_without["node"]["boot_id"]
    _ok(push(again_without))
    assert read("/v1/nodes/node-a").json()["boot_id"] == "boot-1"
    assert read("/v1/events", kind="node_boot").json()["count"] == 0


def _counter_samples(uuid: str, start: datetime, values: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "uuid": uuid,
            "ts": (start + timedelta(seconds=10 * i)).isoformat(),
            "ecc_sbe_volatile_total": v,
        }
        for i, v in enumerate(values)
    ]


def test_ingest_rates_follow_a_monotonic_counter(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    start = datetime.now(UTC) - timedelta(minutes=10)
    _ok(push(_batch_of("node-a", _counter_samples(uuid, start, [0, 5, 15]))))
    rates = read(f"/v1/gpus/{uuid}/samples", rates="true").json()["rates"]
    sbe = rates["ecc_sbe_volatile_total"]
    assert [(r["per_s"], r["increase"], r["reset"]) for r in sbe] == [
        (0.5, 5, False),
        (1.0, 10, False),
    ]
    # Only counters get rates, and a counter never reported has none.
    assert "gpu_temp_c" not in rates
    assert rates["ecc_dbe_volatile_total"] == []


def test_ingest_rates_mark_a_value_drop_as_reset(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    start = datetime.now(UTC) - timedelta(minutes=10)
    _ok(push(_batch_of("node-a", _counter_samples(uuid, start, [100, 120, 4]))))
    sbe = read(f"/v1/gpus/{uuid}/samples", rates="true").json()["rates"]["ecc_sbe_volatile_total"]
    assert sbe[1] == {"ts": sbe[1]["ts"], "per_s": 0.4, "increase": 4, "reset": True}
    assert all(r["per_s"] >= 0 for r in sbe)


def test_ingest_rates_mark_a_boot_change_as_reset(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    start = datetime.now(UTC) - timedelta(minutes=10)
    _ok(push(_batch_of("node-a", _counter_samples(uuid, start, [10, 20]), boot_id="boot-1")))
    # After the reboot the counter restarted and already passed its old value.
    later = _counter_samples(uuid, start + timedelta(seconds=20), [30])
    _ok(push(_batch_of("node-a", later, boot_id="boot-2")))
    data = read(f"/v1/gpus/{uuid}/samples", rates="true").json()
    assert [p["boot_id"] for p in data["data"]] == ["boot-1", "boot-1", "boot-2"]
    sbe = data["rates"]["ecc_sbe_volatile_total"]
    assert [(r["per_s"], r["increase"], r["reset"]) for r in sbe] == [
        (1.0, 10, False),
        (3.0, 30, True),
    ]


# -- latest state and replays of old batches -------------------------------------------------


def test_ingest_old_batch_does_not_overwrite_newer_latest_state(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    now = datetime.now(UTC)
    newer = make_sample(uuid, now - timedelta(minutes=1), gpu_temp_c=50.0)
    older = make_sample(uuid, now - timedelta(minutes=30), gpu_temp_c=30.0)
    _ok(push(_batch_of("node-a", [newer])))
    _ok(push(_batch_of("node-a", [older])))

    latest = read(f"/v1/gpus/{uuid}").json()["latest"]
    assert _iso(latest["ts"]) == _iso(newer["ts"])
    assert latest["values"]["gpu_temp_c"] == 50.0
    # The old readings are still history.
    points = read(f"/v1/gpus/{uuid}/samples").json()["data"]
    assert [p["values"]["gpu_temp_c"] for p in points] == [30.0, 50.0]


def test_ingest_newest_sample_of_a_batch_becomes_latest(push: Push, read: Read) -> None:
    uuid = gpu_uuid("node-a", 0)
    now = datetime.now(UTC)
    # Out of order inside one batch: the newest timestamp wins, not the last position.
    samples = [
        make_sample(uuid, now - timedelta(seconds=10), gpu_temp_c=60.0),
        make_sample(uuid, now - timedelta(seconds=30), gpu_temp_c=40.0),
    ]
    _ok(push(_batch_of("node-a", samples)))
    assert read(f"/v1/gpus/{uuid}").json()["latest"]["values"]["gpu_temp_c"] == 60.0


def test_ingest_latest_state_moves_forward_per_gpu_within_one_batch(push: Push, read: Read) -> None:
    # One batch, two GPUs: the stored state of one is newer than the batch, the other's older.
    first, second = gpu_uuid("node-a", 0), gpu_uuid("node-a", 1)
    now = datetime.now(UTC).replace(microsecond=123456)
    earlier = make_batch("node-a", gpus=2, start=now - timedelta(minutes=5))
    earlier["samples"] = [make_sample(second, now - timedelta(minutes=5), gpu_temp_c=20.0)]
    _ok(push(earlier))
    newer = make_batch("node-a", gpus=1, start=now)
    newer["samples"] = [make_sample(first, now, gpu_temp_c=70.0)]
    _ok(push(newer))

    mixed = make_batch("node-a", gpus=2, start=now - timedelta(minutes=1))
    mixed["samples"] = [
        make_sample(first, now - timedelta(minutes=1), gpu_temp_c=40.0),
        make_sample(second, now - timedelta(minutes=1), gpu_temp_c=45.0),
    ]
    _ok(push(mixed))
    kept = read(f"/v1/gpus/{first}").json()["latest"]
    assert _iso(kept["ts"]) == now and kept["values"]["gpu_temp_c"] == 70.0
    moved = read(f"/v1/gpus/{second}").json()["latest"]
    assert _iso(moved["ts"]) == now - timedelta(minutes=1)
    assert moved["values"]["gpu_temp_c"] == 45.0


# -- node liveness ---------------------------------------------------------------------------


def _node_up_line(text: str, node: str) -> str:
    prefix = f'fleetwatch_node_up{{node="{node}"}} '
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, text
    return found[0].removeprefix(prefix)


def test_ingest_silent_node_becomes_unreachable(
    push: Push, read: Read, client: TestClient, tokens: dict[str, str]
) -> None:
    _ok(push(make_batch("node-slow", gpus=1, interval_s=3600.0)))
    _ok(push(make_batch("node-fast", gpus=1, interval_s=0.25)))
    last_seen = datetime.fromisoformat(read("/v1/nodes/node-fast").json()["last_seen"])
    deadline = last_seen + timedelta(seconds=0.75)  # 3 intervals of node-fast
    states = {n["name"]: n["state"] for n in read("/v1/nodes").json()["data"]}
    if utcnow() < deadline:  # answered before the deadline: it must say up (checked, not raced)
        assert states == {"node-fast": "up", "node-slow": "up"}

    while utcnow() <= deadline + timedelta(milliseconds=50):  # wait out the deadline
        time.sleep(0.05)

    states = {n["name"]: n["state"] for n in read("/v1/nodes").json()["data"]}
    assert states == {"node-fast": "unreachable", "node-slow": "up"}
    assert read("/v1/nodes/node-fast").json()["state"] == "unreachable"
    down = read("/v1/nodes", state="unreachable").json()["data"]
    assert [n["name"] for n in down] == ["node-fast"]

    text = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert _node_up_line(text, "node-fast") == "0"
    assert _node_up_line(text, "node-slow") == "1"
    assert 'fleetwatch_nodes{state="unreachable"} 1' in text.splitlines()

    # One new batch brings it back.
    _ok(push(make_batch("node-fast", gpus=1, interval_s=0.25)))
    assert read("/v1/nodes/node-fast").json()["state"] == "up"
    text = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert _node_up_line(text, "node-fast") == "1"


def test_ingest_node_list_filters_by_label(push: Push, read: Read) -> None:
    _ok(push(make_batch("node-a", gpus=1, labels={"rack": "r1"})))
    _ok(push(make_batch("node-b", gpus=1, labels={"rack": "r2"})))
    found = read("/v1/nodes", label="rack=r2").json()["data"]
    assert [n["name"] for n in found] == ["node-b"]


@pytest.mark.parametrize("query", ["since=junk", "until=5 minutes", "since=-1h"])
def test_ingest_read_api_rejects_bad_time_arguments(
    client: TestClient, tokens: dict[str, str], query: str
) -> None:
    response = client.get(f"/v1/events?{query}", headers=bearer(tokens["read"]))
    assert response.status_code == 422, response.text
    name = query.split("=")[0]
    assert response.json()["detail"][0]["loc"] == ["query", name]
    assert response.json()["error"].startswith(name)
