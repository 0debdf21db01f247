"""Per-fleet rule overrides (FLEETWATCH_SERVER_RULES_FILE) change the server's verdicts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch

from fleetwatch.rules.overrides import load_rules


def _xid_43_batch() -> dict:
    batch = make_batch("node-a", gpus=1, ticks=2)
    pci = batch["gpus"][0]["pci_bus_id"]
    ts = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    batch["events"] = [{"kind": "xid", "ts": ts, "xid": 43, "pci_bus_id": pci,
                        "message": f"NVRM: Xid (PCI:{pci}): 43, pid=77, Ch 00000010"}]  # fmt: skip
    return batch


def _verdicts(client: TestClient, tokens: dict[str, str]) -> list[dict]:
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    answer = client.get(f"/v1/gpus/{gpu_uuid('node-a', 0)}/risk", headers=bearer(tokens["read"]))
    assert answer.status_code == 200, answer.text
    verdicts: list[dict] = answer.json()["verdicts"]
    return verdicts


def test_an_xid_override_turns_an_ignored_code_into_a_reset(
    make_client: Callable[..., TestClient], tokens: dict[str, str], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.toml"
    # An application Xid may not count against a GPU: the fleet recategorises it first.
    rules.write_text('[xid.43]\ncategory = "driver_firmware"\nseverity = "critical"\n'
                     'action = "reset_gpu"\ncounts_against_gpu = true\n')  # fmt: skip
    default, overridden = make_client(), make_client(rules_file=rules)
    assert default.post("/v1/ingest", json=_xid_43_batch(),
                        headers=bearer(tokens["agent"])).status_code == 200  # fmt: skip
    before = [v for v in _verdicts(default, tokens) if 43 in v["xids"]]
    after = [v for v in _verdicts(overridden, tokens) if 43 in v["xids"]]
    assert before and not before[0]["counts_against_gpu"]
    assert after[0]["action"] == "reset_gpu" and after[0]["takes_gpu_out"]


def test_a_health_override_changes_the_threshold(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("[health]\ntemp_margin_c = 5.0\n")
    _catalog, thresholds = load_rules(rules)
    assert thresholds.temp_margin_c == 5.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[xdi.43]\nseverity = 'fatal'\n", "xdi"),
        ("[health]\ntemp_margin_c = -1\n", "temp_margin_c"),
    ],
)
def test_a_bad_rules_file_is_refused_naming_the_problem(
    tmp_path: Path, text: str, needle: str
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(text)
    with pytest.raises(ValueError, match=needle):
        load_rules(rules)
