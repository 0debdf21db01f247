"""Evictions and the drain budget on /metrics: every state exported, counts follow the table."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

from fleetwatch.server.db.session import Database
from fleetwatch.server.metrics.eviction_exposition import EVICTION_STATES
from fleetwatch.server.repo.evictions import create_eviction


def _value(text: str, series: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(series + " ")]
    assert len(lines) == 1, series
    return float(lines[0].split()[-1])


def _evict(db: Database, node: str, state: str) -> None:
    with db.write() as conn:
        create_eviction(
            conn, node=node, state=state, reason_kind="rule", reason="xid_79", evidence={},
            expected_saving_usd=None, dry_run=False, now=datetime.now(UTC),
        )  # fmt: skip


def test_eviction_metrics_export_every_state_at_zero(
    client: TestClient, tokens: dict[str, str]
) -> None:
    text = client.get("/metrics", headers=bearer(tokens["read"])).text
    for state in EVICTION_STATES:
        assert _value(text, f'fleetwatch_evictions{{state="{state}"}}') == 0
    assert _value(text, "fleetwatch_draining_nodes") == 0
    assert _value(text, "fleetwatch_drain_budget_nodes") == 1  # at least one node, always


def test_eviction_metrics_count_states_and_draining_nodes(
    client: TestClient, tokens: dict[str, str], push: Push, db: Database
) -> None:
    for i in range(40):
        assert push(make_batch(f"node-{i:02d}", gpus=1)).status_code == 200
    _evict(db, "node-00", "pending")
    _evict(db, "node-01", "acked")
    _evict(db, "node-02", "paged")
    _evict(db, "node-03", "paged")
    text = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert _value(text, 'fleetwatch_evictions{state="pending"}') == 1
    assert _value(text, 'fleetwatch_evictions{state="paged"}') == 2
    assert _value(text, "fleetwatch_draining_nodes") == 2
    assert _value(text, "fleetwatch_drain_budget_nodes") == 2  # 5 % of 40 nodes
    assert "# TYPE fleetwatch_evictions gauge" in text
