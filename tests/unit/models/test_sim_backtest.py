"""Simulator backtest: no look-ahead in training, sane metrics, and precursors that matter."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from fleetwatch.cli.model_cmd import model
from fleetwatch.models.registry import LOG1P_COVARIATES, RiskBundle
from fleetwatch.models.sim_backtest import (
    METHODS,
    SimBacktestResult,
    default_spec,
    run_sim_backtest,
    without_precursors,
    write_report,
)
from fleetwatch.sim.spec import FleetSpec

CUTOFF_DAY = 30.0


@pytest.fixture(scope="module")
def small_spec() -> FleetSpec:
    """64 GPUs over 60 days, failing fast enough for a few dozen failures."""
    return default_spec(7, nodes=8, days=60.0, monthly_failure_prob=0.3)


@pytest.fixture(scope="module")
def result(small_spec: FleetSpec) -> SimBacktestResult:
    return run_sim_backtest(small_spec, cutoff_day=CUTOFF_DAY, budget=3)


@pytest.fixture(scope="module")
def blind(small_spec: FleetSpec) -> SimBacktestResult:
    return run_sim_backtest(without_precursors(small_spec), cutoff_day=CUTOFF_DAY, budget=3)


def test_sim_backtest_trains_on_nothing_after_the_cutoff(result: SimBacktestResult) -> None:
    train = result.train
    assert len(train) > 0 and train["event"].sum() >= 5
    assert (train["end"] <= result.cutoff).all()
    assert (train["window_end"] <= result.cutoff).all()
    ends = train["install"] + pd.to_timedelta(train["duration"], unit="D")
    assert (ends <= result.cutoff + pd.Timedelta(seconds=1)).all()
    # Failures train as events and end at the failure; the rest are censored at the cutoff.
    censored = train[~train["event"].astype(bool)]
    assert (censored["end"] == result.cutoff).all()


def test_sim_backtest_evaluates_failures_after_the_cutoff_only(result: SimBacktestResult) -> None:
    assert result.n_failures >= 10
    assert (result.failures["failure_time"] > result.cutoff).all()
    assert result.eval_days == int(60.0 - 7.0 - CUTOFF_DAY) + 1


def test_sim_backtest_metrics_are_shares_and_leads_non_negative(
    result: SimBacktestResult,
) -> None:
    for m in METHODS:
        got = result.metrics[m]
        for share in (got.precision, got.recall_24h, got.recall_7d):
            assert 0.0 <= share <= 1.0
        assert got.recall_24h <= got.recall_7d
        assert got.false_flags_per_day >= 0
        leads = result.failures[f"lead_h_{m}"].dropna()
        assert (leads >= 0).all() and (leads <= 7 * 24).all()
        assert got.lead_p10_h <= got.lead_p50_h <= got.lead_p90_h
    # The model flags exactly the budget every day.
    assert result.metrics["model"].flagged_gpu_days == 3 * result.eval_days


def test_sim_backtest_rules_plus_model_recalls_at_least_rules(result: SimBacktestResult) -> None:
    rules, both = result.metrics["rules"], result.metrics["rules+model"]
    assert both.recall_7d >= rules.recall_7d
    assert both.recall_24h >= rules.recall_24h
    assert both.flagged_gpu_days >= rules.flagged_gpu_days


def test_sim_backtest_scores_with_the_product_risk_bundle(result: SimBacktestResult) -> None:
    bundle = result.bundle
    assert isinstance(bundle, RiskBundle) and bundle.has_aft
    aft = bundle.metrics["aft"]
    assert result.features and set(result.coefficients) == set(result.features)
    assert set(aft["log1p"]) == set(result.features) & LOG1P_COVARIATES
    # The training covariates are as the AFT saw them: imputed and within its training range.
    params = bundle.to_params()["aft"]
    assert params["features"] == result.features and set(result.medians) == set(result.features)
    for f, lo, hi in zip(params["features"], params["low"], params["high"], strict=True):
        assert result.train[f].between(lo, hi).all(), f
    # A JSON round trip (as the server stores a version) scores the same.
    loaded = RiskBundle.from_params(bundle.to_params())
    units = result.train.assign(age_days=30.0, group=result.train["sku"])
    assert (loaded.score(units, 7).probability == bundle.score(units, 7).probability).all()


def test_sim_backtest_model_beats_chance_with_precursors(result: SimBacktestResult) -> None:
    assert result.ranking.auc > 0.6
    assert result.metrics["model"].recall_7d > 0.3


def test_sim_backtest_model_recall_drops_without_precursors(
    result: SimBacktestResult, blind: SimBacktestResult
) -> None:
    # Same fleet, same failure times: only the warning signs are gone.
    assert list(blind.failures["failure_time"]) == list(result.failures["failure_time"])
    assert not blind.failures["precursors"].any()
    seen, unseen = result.metrics["model"], blind.metrics["model"]
    assert unseen.recall_7d <= seen.recall_7d - 0.1
    assert unseen.precision <= seen.precision - 0.15
    assert blind.metrics["rules"].recall_7d < result.metrics["rules"].recall_7d


def test_sim_backtest_write_report(result: SimBacktestResult, tmp_path: Path) -> None:
    paths = write_report(result, tmp_path / "out")
    csv = pd.read_csv(paths[0])
    assert len(csv) == result.n_failures
    assert {"uuid", "failure_time", "lead_h_model", "lead_h_rules"} <= set(csv.columns)
    budget = pd.read_csv(paths[1])
    assert paths[1].name == "drain_budget.csv"
    assert set(budget["ranking"]) == {"model", "age_only", "random"}
    assert budget["marked"].any() and budget["precision"].between(0, 1).all()
    if len(paths) > 2:
        assert paths[2].suffix == ".png" and paths[2].stat().st_size > 0


def test_sim_backtest_rejects_a_cutoff_past_the_horizon(small_spec: FleetSpec) -> None:
    with pytest.raises(ValueError, match="cutoff day"):
        run_sim_backtest(small_spec, cutoff_day=58.0)


def test_model_sim_backtest_cli_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["sim-backtest", "--nodes", "3", "--days", "40", "--cutoff-day", "20"]
    args += ["--budget", "2", "--monthly-failure-prob", "0.5", "--out", str(out)]
    got = CliRunner().invoke(model, args)
    assert got.exit_code == 0, got.output
    header = next(line for line in got.output.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", *METHODS]
    for row in ("precision@budget", "recall@24h", "recall@7d", "lead p50 (h)", "false flags/day"):
        assert row in got.output
    assert "weekly drain budget:" in got.output and "| model | 1 % |" in got.output
    assert (out / "drain_budget.csv").exists()
    assert (out / "lead_times.csv").is_file()


def test_model_sim_backtest_cli_too_few_failures_is_one_line() -> None:
    args = ["sim-backtest", "--nodes", "1", "--days", "30", "--cutoff-day", "10"]
    args += ["--monthly-failure-prob", "0.0001"]
    got = CliRunner().invoke(model, args)
    assert got.exit_code == 1
    assert "simulate more nodes" in got.output
    assert "Traceback" not in got.output


def test_model_sim_backtest_cli_bad_cutoff_is_one_line() -> None:
    args = ["sim-backtest", "--nodes", "1", "--days", "20", "--cutoff-day", "19"]
    got = CliRunner().invoke(model, args)
    assert got.exit_code == 1
    assert "cutoff day 19" in got.output
    assert "Traceback" not in got.output


def test_sim_budget_on_a_real_backtest(result: SimBacktestResult) -> None:
    from fleetwatch.models.sim_budget import notice_curve, sim_budget

    budget = sim_budget(result)
    assert budget.fleet == int((result.scores["day"] == 0).sum()) and budget.weeks >= 3
    for ranking, curve in budget.curves.items():
        assert len({p.failures for p in curve}) == 1, ranking  # one period for every budget
        assert all(p.drains <= p.k * budget.weeks for p in curve)
    model = budget.at("model", budget.ks[-1])
    assert model.hits > budget.at("random", budget.ks[-1]).hits
    curve = notice_curve(result)
    notices = [p.notices for p in curve]
    assert notices == sorted(notices, reverse=True) and notices[0] > notices[-1]
    assert all(p.failures == curve[0].failures > 0 for p in curve)
