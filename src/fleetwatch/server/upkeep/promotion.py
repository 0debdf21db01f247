"""Champion/challenger: whether a refit's model replaces the model in service.

At refit time ``now``, with ``W = model_holdout_days``, the held-out window is
``(now - W, now]``. Its units are the GPU lifetimes in service at the window's start; a unit's
label is whether it failed in the window (:func:`~.training_frame.window_outcomes`). Two models
score those units' risk of failure within ``W`` days, from their age and covariates at the
window's start:

* the **challenger**: the refit's recipe (the same fit, the same settings) fitted only on what
  had been stored by the window's start;
* the **champion**: the version in service (the newest ``ok`` one) as stored. When it was trained
  after the window's start it has seen part of the window (``in_sample``), which can only flatter
  it: the rule stays conservative.

The challenger can score by each of its parts (:data:`~fleetwatch.models.registry.SCORERS`:
landmark model, AFT, Weibull fits). With at least ``min_failures`` failures in the window, each
part the refit has is scored and the refit scores by the best (AUC, then average precision,
then the simpler part); with fewer it scores by its most specific part, and the evaluation says
so. Choosing the best of up to three flatters the challenger a little; the champion's score is
its own scorer's alone.

:func:`fleetwatch.models.holdout.promotion` then decides; a refit that fails to fit is never
promoted, and when no version is in service the rules alone judge the fleet. The evaluation is
stored with the version (``risk_models.evaluation``, shown by ``GET /v1/models``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection

from fleetwatch.models.base import ModelFitError
from fleetwatch.models.holdout import Decision, HoldoutScore, holdout_score, promotion
from fleetwatch.models.registry import AGE, DURATION_DAYS, EVENT, SCORERS, RiskBundle, Scorer
from fleetwatch.server.repo.models import StoredModel
from fleetwatch.server.upkeep.training_frame import training_frame, window_outcomes

__all__ = ["ChampionScore", "Evaluation", "Recipe", "choose_scorer", "evaluate", "not_fitted"]


Recipe = Callable[[Connection, datetime], RiskBundle]
"""A refit's fit on what was stored by a moment (:class:`ModelFitError` if it cannot be
fitted)."""


@dataclass(frozen=True)
class ChampionScore:
    version: int
    score: HoldoutScore
    """Without AUC, AP or ECE when the stored version cannot be read back (the decision's
    reason says why)."""
    in_sample: bool
    """Trained after the window's start: it has seen part of the window."""


@dataclass(frozen=True)
class Evaluation:
    window_start: datetime
    window_end: datetime
    challenger: HoldoutScore
    champion: ChampionScore | None
    decision: Decision
    scorer: Scorer
    """The part the refit scores by."""
    scorer_reason: str
    by_scorer: dict[Scorer, HoldoutScore] = field(default_factory=dict)
    """Each part of the challenger scored on the window (empty when they were not compared)."""

    @property
    def promoted(self) -> bool:
        return self.decision.promoted

    def to_json(self) -> dict[str, Any]:
        """The stored (and listed) form: ``GET /v1/models``' ``evaluation``."""
        champion = None
        if self.champion is not None:
            score = self.champion.score
            champion = {
                "version": self.champion.version,
                "auc": score.auc,
                "ap": score.ap,
                "ece": score.ece,
                "in_sample": self.champion.in_sample,
            }
        return {
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "challenger": self.challenger.to_json(),
            "champion": champion,
            "promoted": self.decision.promoted,
            "reason": self.decision.reason,
            "scorer": self.scorer,
            "scorer_reason": self.scorer_reason,
            "scorers": {k: v.to_json() for k, v in self.by_scorer.items()},
        }


def _simplicity(scorer: Scorer) -> int:
    """Larger for a simpler part: a tie goes to it."""
    return SCORERS.index(scorer)


def choose_scorer(
    scores: dict[Scorer, HoldoutScore], default: Scorer, min_failures: int
) -> tuple[Scorer, str]:
    """The part to score by and why (see the module docstring)."""
    ranked = [(k, v) for k, v in scores.items() if v.auc is not None]
    if not ranked:
        return default, "its most specific part: no part could be scored on the window"
    failures = ranked[0][1].failures
    if failures < min_failures:
        return default, f"its most specific part: {failures} failures in the window are too few"

    def key(item: tuple[Scorer, HoldoutScore]) -> tuple[float, float, int]:
        kind, score = item
        return (score.auc or 0.0, score.ap or 0.0, _simplicity(kind))

    best, score = max(ranked, key=key)
    others = ", ".join(f"{k} {v.auc:.3f}" for k, v in ranked if k != best)
    return best, f"the best AUC on the window ({score.auc:.3f}" + (
        f"; {others})" if others else ")"
    )


def _units(past: pd.DataFrame, ids: pd.Index) -> pd.DataFrame:
    """The units to score: ``past``'s rows of ``ids`` (open at the window's start, so their
    duration is their age then), with ``age_days`` in place of duration and event."""
    units = past.loc[ids].drop(columns=[EVENT])
    return units.rename(columns={DURATION_DAYS: AGE})


def evaluate(
    conn: Connection,
    *,
    now: datetime,
    holdout_days: float,
    recipe: Recipe,
    champion: StoredModel | None,
    min_failures: int,
    window_days: float,
    location_pattern: str | None,
    scorers: Sequence[Scorer] = SCORERS,
) -> Evaluation:
    """Score the challenger (``recipe`` fitted at the window's start, by each of ``scorers`` it
    has: the parts the refit has) and ``champion`` on the window ``(now - holdout_days, now]``;
    choose the challenger's part and decide (see the module docstring)."""
    start = now - timedelta(days=holdout_days)
    past = training_frame(
        conn, now=start, window_days=window_days, location_pattern=location_pattern
    )
    outcomes = window_outcomes(conn, start=start, end=now)
    units = _units(past, outcomes.index)
    label = outcomes.to_numpy(dtype=np.bool_)

    unscored = HoldoutScore(None, None, None, n=len(label), failures=int(label.sum()))
    fit_error: str | None = None
    by_scorer: dict[Scorer, HoldoutScore] = {}
    if len(label):
        try:
            fitted = recipe(conn, start)
            for kind in (k for k in scorers if k in fitted.scorers):
                risk = fitted.with_scorer(kind).probability(units, holdout_days)
                by_scorer[kind] = holdout_score(risk, label)
        except ModelFitError as exc:
            fit_error = str(exc)
    default = scorers[0] if scorers else "weibull"
    scorer, scorer_reason = choose_scorer(by_scorer, default, min_failures)
    challenger = by_scorer.get(scorer, unscored)

    scored: ChampionScore | None = None
    champion_error: str | None = None
    if champion is not None:
        score = unscored
        if len(label):
            try:
                score = holdout_score(champion.bundle().probability(units, holdout_days), label)
            except ModelFitError as exc:  # a stored format this version cannot read
                champion_error = str(exc)
        scored = ChampionScore(champion.version, score, in_sample=champion.trained_at > start)

    compared = scored is not None and challenger.failures >= min_failures
    if compared and fit_error is not None:
        decision = Decision(
            True,
            "not compared: the refit's recipe could not be fitted on what was known at the "
            f"window start ({fit_error})",
        )
    elif compared and champion_error is not None:
        decision = Decision(True, f"not compared: the champion cannot be scored ({champion_error})")
    else:
        decision = promotion(
            challenger, None if scored is None else scored.score, min_failures=min_failures
        )
    return Evaluation(
        start,
        now,
        challenger,
        scored,
        decision,
        scorer=scorer,
        scorer_reason=scorer_reason,
        by_scorer=dict(by_scorer),
    )


def not_fitted(
    *, now: datetime, holdout_days: float, error: str, serving: int | None
) -> dict[str, Any]:
    """The stored evaluation of a refit that did not fit: nothing scored, never promoted, and
    what serves instead (``serving``: the version in service, if any)."""
    instead = (
        f"version {serving} stays in service"
        if serving is not None
        else "no model in service: the rules alone judge the fleet"
    )
    return {
        "window_start": (now - timedelta(days=holdout_days)).isoformat(),
        "window_end": now.isoformat(),
        "challenger": None,
        "champion": None,
        "promoted": False,
        "reason": f"not fitted ({error}); {instead}",
    }
