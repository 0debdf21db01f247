"""A MIG-enabled GPU on the server (issue 13): its MIG layout is taken, stored beside its newest
sample and shown by the GPU API; its whole-GPU readings are judged exactly as any GPU's."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi.testclient import TestClient
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push

from fleetwatch.server.repo.gpus import LATEST_MIG_KEY
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES

Read = Callable[..., httpx.Response]

LAYOUT = {
    "current": "enabled",
    "pending": "enabled",
    "instances": [
        {"gpu_instance_id": 1, "compute_instance_id": 0, "index": 0, "profile": "3g.40gb",
         "uuid": "MIG-7089d0f3-293f-58c9-8f8c-5ea666eedbde"},
        {"gpu_instance_id": 5, "compute_instance_id": 0, "index": 1, "profile": "2g.20gb"},
    ],
}  # fmt: skip
# What NVML and nvidia-smi cannot report for a MIG-enabled GPU: absent from its samples.
NOT_UNDER_MIG = (
    "gpu_util_pct",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
)


def _mig_batch(node: str, layout: dict[str, Any] | None = LAYOUT, **values: Any) -> dict:
    """GPU 0 with MIG (its samples lack what MIG hides), GPU 1 without, same other values."""
    batch = make_batch(node, gpus=2, ticks=2)
    if layout is not None:
        batch["gpus"][0]["mig"] = layout
    for sample in batch["samples"]:
        sample.update(values)
        if sample["uuid"] == batch["gpus"][0]["uuid"] and layout is not None:
            for name in NOT_UNDER_MIG:
                sample.pop(name)
    return batch


def _shown(layout: dict[str, Any] | None) -> dict[str, Any] | None:
    """A layout as the API shows it: what was sent (the API writes absent fields as null)."""
    if layout is None:
        return None
    instances = [{k: v for k, v in i.items() if v is not None} for i in layout["instances"]]
    return {k: v for k, v in layout.items() if v is not None} | {"instances": instances}


def test_the_mig_key_is_no_sample_field() -> None:
    assert LATEST_MIG_KEY not in SAMPLE_FIELD_NAMES


def test_a_mig_layout_is_stored_and_shown_with_the_gpu(push: Push, read: Read) -> None:
    assert push(_mig_batch("node-m")).status_code == 200

    gpus = {g["uuid"]: g for g in read("/v1/gpus").json()}
    mig_gpu, plain = gpus[gpu_uuid("node-m", 0)], gpus[gpu_uuid("node-m", 1)]
    assert _shown(mig_gpu["mig"]) == LAYOUT
    assert plain["mig"] is None
    # The layout is no sample field: the latest values hold only what the GPU reported.
    assert LATEST_MIG_KEY not in mig_gpu["latest"]["values"]
    assert "gpu_util_pct" not in mig_gpu["latest"]["values"]
    assert mig_gpu["latest"]["values"]["gpu_temp_c"] == 41.0
    detail = read(f"/v1/gpus/{gpu_uuid('node-m', 0)}").json()
    assert _shown(detail["mig"]) == LAYOUT


def test_the_newest_batch_says_which_layout_stands(push: Push, read: Read) -> None:
    assert push(_mig_batch("node-m")).status_code == 200
    one = {**LAYOUT, "instances": LAYOUT["instances"][:1]}
    later = datetime.now(UTC) - timedelta(seconds=1)
    batch = _mig_batch("node-m", one)
    for sample in batch["samples"]:
        sample["ts"] = later.isoformat()
    assert push(batch).status_code == 200
    assert _shown(read(f"/v1/gpus/{gpu_uuid('node-m', 0)}").json()["mig"]) == one

    # MIG turned off (the agent sends no layout): none stands any more.
    batch = _mig_batch("node-m", None)
    for sample in batch["samples"]:
        sample["ts"] = datetime.now(UTC).isoformat()
    assert push(batch).status_code == 200
    assert read(f"/v1/gpus/{gpu_uuid('node-m', 0)}").json()["mig"] is None


def test_a_bad_layout_is_a_422_naming_it(push: Push) -> None:
    batch = _mig_batch("node-m", {"current": "on", "instances": []})
    response = push(batch)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][:5] == ["body", "gpus", 0, "mig", "current"]
    batch = _mig_batch("node-m", {"instances": [{"gpu_instance_id": 1, "uuid": "GPU-x"}]})
    assert push(batch).status_code == 422


def _verdicts(read: Read, uuid: str) -> list[tuple[str, str, str, bool]]:
    gpu = read(f"/v1/gpus/{uuid}/risk").json()
    return sorted((v["rule"], v["action"], v["severity"], v["counts_against_gpu"])
                  for v in gpu["verdicts"])  # fmt: skip


def test_a_mig_gpu_is_judged_as_a_gpu_without_mig_with_the_same_readings(
    client: TestClient, push: Push, read: Read
) -> None:
    # Uncorrectable ECC and a die 3 C from H100's slowdown temperature, on both GPUs.
    batch = _mig_batch("node-m", ecc_dbe_volatile_total=2, gpu_temp_c=87.0)
    assert push(batch).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]

    mig, plain = _verdicts(read, gpu_uuid("node-m", 0)), _verdicts(read, gpu_uuid("node-m", 1))
    assert mig == plain
    assert {rule for rule, *_ in mig} >= {"ecc_dbe_volatile", "temperature_margin"}
    # Remapped rows are absent under MIG: no evidence, so no row-remap verdict of any kind.
    assert not any(rule.startswith("row_remap") for rule, *_ in mig)
