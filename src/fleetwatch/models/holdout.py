"""Scoring risks on a held-out window, and the rule that promotes a refit (champion/challenger).

A model's risks :math:`p_i` for the units in service at the window's start are compared with
what happened in the window, :math:`y_i = 1` iff unit *i* failed in it:

* **AUC**: the probability that a unit that failed was ranked above one that did not (ties count
  half), from the Mann-Whitney rank sum :math:`(R_1 - n_1(n_1+1)/2) / (n_1 n_0)`;
* **AP** (average precision): :math:`\\sum_k (r_k - r_{k-1})\\,P_k` over the distinct risks from
  the highest down, with :math:`P_k` and :math:`r_k` the precision and recall of flagging every
  unit at or above the k-th (scikit-learn's ``average_precision_score``);
* **ECE** (expected calibration error): 10 equal-width bins of :math:`p`,
  :math:`\\sum_b \\frac{n_b}{n} \\left|\\bar p_b - \\bar y_b\\right|`, a risk of exactly 1 in
  the last bin.

AUC and AP need both a failure and a survivor (None otherwise); ECE needs one unit.

:func:`promotion` decides between the refit (the challenger) and the model in service (the
champion) on such scores: see its docstring. numpy only: the server imports this.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "ECE_BINS",
    "Decision",
    "HoldoutScore",
    "average_precision",
    "expected_calibration_error",
    "holdout_score",
    "promotion",
    "roc_auc",
]

ECE_BINS = 10


@dataclass(frozen=True)
class HoldoutScore:
    """One model's scores on one window's units."""

    auc: float | None
    ap: float | None
    ece: float | None
    n: int
    """Units scored: in service at the window's start."""
    failures: int
    """Of those, units that failed in the window."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    promoted: bool
    reason: str


def _checked(risk: ArrayLike, label: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    p = np.asarray(risk, dtype=np.float64)
    y = np.asarray(label)
    if p.ndim != 1 or y.shape != p.shape:
        raise ValueError(f"risk and label must be 1-D of one length, got {p.shape} and {y.shape}")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("label must hold 0/1 or booleans (1: failed in the window)")
    if not (np.isfinite(p) & (p >= 0) & (p <= 1)).all():
        raise ValueError("risk must be probabilities: finite, in [0, 1]")
    return p, y.astype(np.bool_)


def _midranks(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ranks 1..n of ``values``, ties sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # Start of each run of equal values, and the mean rank of the run (positions are 0-based).
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def roc_auc(risk: ArrayLike, label: ArrayLike) -> float | None:
    """Area under the ROC curve; None without both a failure and a survivor.

    Examples
    --------
    >>> roc_auc([0.9, 0.1, 0.5, 0.5], [1, 0, 1, 0])
    0.875
    """
    p, y = _checked(risk, label)
    n1 = int(y.sum())
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        return None
    rank_sum = float(_midranks(p)[y].sum())
    return (rank_sum - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def average_precision(risk: ArrayLike, label: ArrayLike) -> float | None:
    """Average precision (step-wise, no interpolation); None without both classes.

    Examples
    --------
    >>> round(average_precision([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]), 4)
    0.8333
    """
    p, y = _checked(risk, label)
    n1 = int(y.sum())
    if n1 == 0 or n1 == len(y):
        return None
    order = np.argsort(-p, kind="mergesort")
    ordered, hits = p[order], y[order]
    # The last position of each run of equal risks: a threshold flags a whole run at once.
    last = np.flatnonzero(np.r_[ordered[1:] != ordered[:-1], True])
    tp = np.cumsum(hits)[last]
    precision = tp / (last + 1.0)
    recall = tp / n1
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def expected_calibration_error(
    risk: ArrayLike, label: ArrayLike, bins: int = ECE_BINS
) -> float | None:
    """Mean gap between predicted risk and observed failure rate over ``bins`` equal-width bins,
    weighted by the units in each; None without units.

    Examples
    --------
    >>> expected_calibration_error([0.05, 0.05, 0.95, 0.95], [0, 1, 1, 1])
    0.25
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    p, y = _checked(risk, label)
    if len(p) == 0:
        return None
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins)
    gap = np.bincount(which, weights=p, minlength=bins) - np.bincount(
        which, weights=y.astype(np.float64), minlength=bins
    )
    # sum_b n_b/n * |mean p_b - mean y_b| = sum_b |sum p_b - sum y_b| / n
    return float(np.abs(gap[count > 0]).sum() / len(p))


def holdout_score(risk: ArrayLike, label: ArrayLike) -> HoldoutScore:
    """AUC, AP and ECE of ``risk`` against ``label`` (1: failed in the window)."""
    p, y = _checked(risk, label)
    return HoldoutScore(
        auc=roc_auc(p, y),
        ap=average_precision(p, y),
        ece=expected_calibration_error(p, y),
        n=len(p),
        failures=int(y.sum()),
    )


def promotion(
    challenger: HoldoutScore, champion: HoldoutScore | None, *, min_failures: int
) -> Decision:
    """Whether the challenger replaces the champion, and why.

    1. No champion: promote.
    2. Fewer than ``min_failures`` failures in the window: promote without comparing (so
       a young or quiet fleet keeps getting fresh fits), saying how many there were.
    3. Every unit failed (or none did): nothing to rank; promote without comparing.
    4. Otherwise promote iff the challenger ranks at least as well: a higher AUC, or an equal
       AUC and an AP at least as high (a tie on both goes to the fresher fit). ECE is shown,
       never decisive.

    Both scores must be on the same units (the failure counts are taken from ``challenger``).
    """
    if champion is None:
        return Decision(True, "no model in service")
    if challenger.failures < min_failures:
        return Decision(
            True,
            f"not compared: {challenger.failures} failures in the window "
            f"(fewer than {min_failures})",
        )
    if challenger.auc is None or champion.auc is None:
        return Decision(True, "not compared: no unit in the window survived it")
    auc, best_auc = challenger.auc, champion.auc
    if auc != best_auc:
        a, b = _distinct(auc, best_auc)
        if auc > best_auc:
            return Decision(True, f"promoted: AUC {a} > {b}")
        return Decision(False, f"kept the champion: AUC {a} < {b}")
    ap, best_ap = challenger.ap or 0.0, champion.ap or 0.0
    a, b = _distinct(ap, best_ap)
    if ap >= best_ap:
        return Decision(True, f"promoted: AUC tied at {auc:.3f}, AP {a} >= {b}")
    return Decision(False, f"kept the champion: AUC tied at {auc:.3f}, AP {a} < {b}")


def _distinct(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` with 3 decimals, or as many more (up to 6) as it takes to tell them apart:
    refits of a stable fleet often differ in the fourth."""
    for digits in range(3, 7):
        shown = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if shown[0] != shown[1]:
            return shown
    return f"{a:.3f}", f"{b:.3f}"
