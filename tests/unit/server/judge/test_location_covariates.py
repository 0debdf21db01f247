"""The ``loc_*`` covariates a refit fits from each lifetime's location (``location_pattern``) are
the ones the server scores with: each GPU's come from the location of its newest lifetime, in
the whole-fleet pass and in a targeted one, on SQLite and PostgreSQL. Before, the AFT was fitted
on them and scored every GPU on their training median: the location changed nothing served."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from tests.conftest import bearer
from tests.factories import make_batch

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import RiskBundle
from fleetwatch.rules.overrides import load_rules
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_lifetimes, gpus
from fleetwatch.server.judge.assessment import GpuRisk
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.repo.models import store_model

RACK_PATTERN = r"r(?P<rack>\d+)-u\d+"


def _bundle() -> RiskBundle:
    """An AFT fitted on lifetimes where rack 2 wears GPUs out ten times faster than rack 1."""
    rng = np.random.default_rng(3)
    rack = np.repeat([1.0, 2.0, 2.0], 200)  # the median rack is 2
    life = np.where(rack == 2, 60.0, 600.0) * rng.weibull(1.5, 600)
    censor = rng.uniform(50, 800, 600)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor),
        "event": (life <= censor).astype(int),
        "loc_rack": rack,
    })  # fmt: skip
    return RiskBundle.fit(frame)


def _risks(assessor: Assessor, horizon_days: float = 7.0) -> dict[int, GpuRisk]:
    snapshot = assessor.latest
    assert snapshot is not None
    return {r.gpu.index: r for r in snapshot.risks(horizon_days)}


def test_each_gpu_is_scored_on_the_location_parts_of_its_newest_lifetime(
    client: TestClient, db: Database, tokens: dict[str, str], settings: ServerSettings
) -> None:
    batch = make_batch("node-a", gpus=3)
    pushed = client.post("/v1/ingest", json=batch, headers=bearer(tokens["agent"]))
    assert pushed.status_code == 200, pushed.text
    now = datetime.now(UTC)
    installed = now - timedelta(days=100)
    with db.write() as conn:
        serials = list(conn.execute(select(gpus.c.serial).order_by(gpus.c.index)).scalars())
        rows = [
            # GPU 0 sat in rack 2 once and was moved to rack 1: its newest lifetime counts.
            (serials[0], "r2-u03", now - timedelta(days=400), now - timedelta(days=200)),
            (serials[0], "r1-u01", installed, None),
            (serials[1], "r2-u07", installed, None),
            (serials[2], "hall-b", installed, None),  # the pattern does not match: no loc_rack
        ]
        conn.execute(
            insert(gpu_lifetimes),
            [
                {"serial": s, "location": loc, "installed_at": at, "removed_at": end,
                 "end_kind": "repair" if end else None, "source": "import"}
                for s, loc, at, end in rows
            ],
        )  # fmt: skip
        store_model(conn, _bundle(), trigger="manual", trained_at=now - timedelta(hours=1))

    catalog, thresholds = load_rules(settings.rules_file)
    located = settings.model_copy(update={"location_pattern": RACK_PATTERN})
    assessor = Assessor(db, located, catalog, thresholds)
    assessor.run_once(now)
    risks = _risks(assessor)
    assert {i: r.basis for i, r in risks.items()} == {0: "model", 1: "model", 2: "model"}
    assert [risks[i].gpu.features.get("loc_rack") for i in range(3)] == [1.0, 2.0, None]
    rack1, rack2, unknown = (risks[i].probability for i in range(3))
    assert rack1 is not None and rack2 is not None and unknown is not None
    assert rack2 > 3 * rack1, (rack1, rack2)
    assert unknown == rack2  # not reported: imputed with the training median, rack 2
    assert "loc_rack" in [f.name for f in risks[1].factors]

    # A targeted pass (the urgent lane's) reads the same parts for the nodes it judges.
    assessor.run_nodes(["node-a"], now + timedelta(seconds=1))
    again = [r.probability for r in _risks(assessor).values()]
    assert again == pytest.approx([rack1, rack2, unknown], rel=1e-6)  # a second older

    # Without the pattern the location says nothing: every GPU of one age scores alike.
    plain = Assessor(db, settings, catalog, thresholds)
    plain.run_once(now)
    alike = {r.probability for r in _risks(plain).values()}
    assert alike == {unknown}


def test_a_pattern_that_is_no_regex_leaves_the_location_out_and_says_so(
    db: Database, settings: ServerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Every refit fails on it and stores why; the server still starts and scores."""
    catalog, thresholds = load_rules(settings.rules_file)
    broken = settings.model_copy(update={"location_pattern": "r(?P<rack"})
    with caplog.at_level(logging.ERROR):
        assessor = Assessor(db, broken, catalog, thresholds)
    assert assessor.location_pattern is None
    assert "location_pattern not used for scoring" in caplog.text and "r(?P<rack" in caplog.text
