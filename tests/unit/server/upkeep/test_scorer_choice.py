"""Which part of a refit serves: the best on the window, a tie to the simpler part, and the
most specific part when the window cannot tell them apart."""

from __future__ import annotations

from fleetwatch.models.holdout import HoldoutScore
from fleetwatch.models.registry import Scorer
from fleetwatch.server.upkeep.promotion import choose_scorer


def _score(auc: float | None, ap: float | None = 0.1, failures: int = 20) -> HoldoutScore:
    return HoldoutScore(auc, ap, 0.01, n=500, failures=failures)


def test_the_best_auc_serves_and_the_reason_names_the_others() -> None:
    scores: dict[Scorer, HoldoutScore] = {
        "landmark": _score(0.81),
        "aft": _score(0.84),
        "weibull": _score(0.60),
    }
    scorer, reason = choose_scorer(scores, "landmark", min_failures=10)
    assert scorer == "aft"
    assert reason == "the best AUC on the window (0.840; landmark 0.810, weibull 0.600)"


def test_average_precision_breaks_an_auc_tie_then_the_simpler_part_wins() -> None:
    by_ap: dict[Scorer, HoldoutScore] = {"landmark": _score(0.8, 0.3), "aft": _score(0.8, 0.2)}
    assert choose_scorer(by_ap, "landmark", min_failures=10)[0] == "landmark"
    tied: dict[Scorer, HoldoutScore] = {"landmark": _score(0.8, 0.2), "aft": _score(0.8, 0.2)}
    assert choose_scorer(tied, "landmark", min_failures=10)[0] == "aft"
    all_tied: dict[Scorer, HoldoutScore] = {**tied, "weibull": _score(0.8, 0.2)}
    assert choose_scorer(all_tied, "landmark", min_failures=10)[0] == "weibull"


def test_too_few_failures_or_nothing_scored_keep_the_most_specific_part() -> None:
    few: dict[Scorer, HoldoutScore] = {
        "landmark": _score(0.5, failures=3),
        "aft": _score(0.9, failures=3),
    }
    scorer, reason = choose_scorer(few, "landmark", min_failures=10)
    assert scorer == "landmark"
    assert reason == "its most specific part: 3 failures in the window are too few"
    unscored: dict[Scorer, HoldoutScore] = {"aft": _score(None, None)}
    scorer, reason = choose_scorer(unscored, "aft", min_failures=10)
    assert scorer == "aft" and "no part could be scored" in reason
    assert choose_scorer({}, "weibull", min_failures=10)[0] == "weibull"
