"""Held-out scores (AUC, AP, ECE) on hand-made cases, and the promotion rule."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from fleetwatch.models.holdout import (
    HoldoutScore,
    average_precision,
    expected_calibration_error,
    holdout_score,
    promotion,
    roc_auc,
)


def test_roc_auc_counts_pairs_and_ties_half() -> None:
    # Failures 0.9, 0.5; survivors 0.1, 0.5: pairs won 1 + 1 + 1 + 0.5 of 4.
    assert roc_auc([0.9, 0.1, 0.5, 0.5], [1, 0, 1, 0]) == 0.875
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert roc_auc([0.3, 0.3, 0.3], [1, 0, 0]) == 0.5  # one risk for all: a coin


def test_average_precision_steps_at_each_distinct_risk() -> None:
    # Flag 0.9: P 1, R 1/2; 0.8: P 1/2; 0.7: P 2/3, R 1. AP = 1/2 * 1 + 1/2 * 2/3.
    assert average_precision([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(5 / 6)
    # Tied risks are flagged together: 0.5 flags two units at once, one failed (P 1/2, R 1).
    assert average_precision([0.5, 0.5, 0.1], [1, 0, 0]) == pytest.approx(0.5)
    assert average_precision([0.9, 0.1], [1, 0]) == 1.0


def test_ranking_scores_need_a_failure_and_a_survivor() -> None:
    assert roc_auc([0.2, 0.4], [0, 0]) is None
    assert average_precision([0.2, 0.4], [1, 1]) is None
    assert roc_auc([], []) is None


def test_ranking_scores_agree_with_scikit_learn_on_ties(rng: np.random.Generator) -> None:
    risk = rng.choice([0.01, 0.02, 0.05, 0.3], size=200)  # few distinct values: many ties
    label = rng.random(200) < risk * 2
    assert roc_auc(risk, label) == pytest.approx(roc_auc_score(label, risk), abs=1e-12)
    expected = average_precision_score(label, risk)
    assert average_precision(risk, label) == pytest.approx(expected, abs=1e-12)


def test_expected_calibration_error_weighs_each_bin_by_its_units() -> None:
    # Bin [0, 0.1): p 0.05 vs 1 failure in 2 -> 0.45, weight 1/2; bin [0.9, 1]: 0.95 vs 1 -> 0.05.
    assert expected_calibration_error([0.05, 0.05, 0.95, 0.95], [0, 1, 1, 1]) == pytest.approx(0.25)
    # Calibrated within each bin: no error, whatever the ranking.
    assert expected_calibration_error([0.25, 0.25, 0.25, 0.25], [1, 0, 0, 0]) == 0.0
    # A risk of exactly 1 falls in the last bin, not an eleventh.
    assert expected_calibration_error([1.0, 0.9], [1, 1]) == pytest.approx(0.05)
    assert expected_calibration_error([], []) is None


def test_holdout_score_refuses_what_is_not_a_probability_or_a_label() -> None:
    with pytest.raises(ValueError, match="probabilities"):
        holdout_score([0.5, 1.5], [0, 1])
    with pytest.raises(ValueError, match="0/1"):
        holdout_score([0.5, 0.5], [0, 2])
    with pytest.raises(ValueError, match="one length"):
        holdout_score([0.5], [0, 1])
    score = holdout_score([0.9, 0.1, 0.5], [1, 0, 0])
    assert (score.n, score.failures, score.auc, score.ap) == (3, 1, 1.0, 1.0)


def _score(auc: float | None, ap: float | None, failures: int = 20) -> HoldoutScore:
    return HoldoutScore(auc=auc, ap=ap, ece=0.01, n=1000, failures=failures)


def test_promotion_without_a_champion_promotes() -> None:
    decision = promotion(_score(0.6, 0.1), None, min_failures=10)
    assert decision.promoted and decision.reason == "no model in service"


def test_promotion_with_too_few_failures_promotes_without_comparing() -> None:
    decision = promotion(_score(0.5, 0.1, failures=9), _score(0.9, 0.5, 9), min_failures=10)
    assert decision.promoted
    assert decision.reason == "not compared: 9 failures in the window (fewer than 10)"


def test_promotion_compares_auc_first() -> None:
    better = promotion(_score(0.81, 0.10), _score(0.80, 0.30), min_failures=10)
    assert better.promoted and better.reason == "promoted: AUC 0.810 > 0.800"
    worse = promotion(_score(0.79, 0.90), _score(0.80, 0.10), min_failures=10)
    assert not worse.promoted and worse.reason == "kept the champion: AUC 0.790 < 0.800"


def test_promotion_breaks_an_auc_tie_on_average_precision() -> None:
    assert promotion(_score(0.8, 0.2), _score(0.8, 0.2), min_failures=10).promoted
    lost = promotion(_score(0.8, 0.1), _score(0.8, 0.2), min_failures=10)
    assert (
        not lost.promoted
        and lost.reason == "kept the champion: AUC tied at 0.800, AP 0.100 < 0.200"
    )


def test_promotion_without_survivors_does_not_compare() -> None:
    decision = promotion(_score(None, None), _score(None, None), min_failures=10)
    assert decision.promoted and decision.reason.startswith("not compared")


def test_promotion_reasons_show_the_digits_that_differ() -> None:
    close = promotion(_score(0.84412, 0.1), _score(0.84437, 0.1), min_failures=10)
    assert not close.promoted and close.reason == "kept the champion: AUC 0.8441 < 0.8444"
    tied = promotion(_score(0.8, 0.0123456), _score(0.8, 0.0123456), min_failures=10)
    assert tied.reason == "promoted: AUC tied at 0.800, AP 0.012 >= 0.012"
