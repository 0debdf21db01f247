"""A fitted gradient-boosted tree ensemble as plain arrays, scored with numpy alone.

scikit-learn's ``HistGradientBoostingClassifier`` keeps its trees as record arrays
(``_predictors``). :func:`TreeEnsemble.from_sklearn` copies the parts prediction needs (split
feature, threshold, children, leaf values) so that a model version can be stored as JSON
(:meth:`TreeEnsemble.to_params`) and scored by a process that never imports scikit-learn, as
:class:`~fleetwatch.models.registry.RiskBundle` is. The raw score of a row is

.. math:: f(x) = b + \\sum_{k} v_k(\\mathrm{leaf}_k(x))

where a row goes left at a split when :math:`x_j \\le \\theta` (and where a missing :math:`x_j`
goes is recorded per split); :math:`P = 1/(1 + e^{-f})` for a binary classifier.

:meth:`TreeEnsemble.contributions` splits :math:`f(x)` among the features by each row's path
(Saabas' path attribution): every node's expected value :math:`E_n` is the mean leaf value below
it, weighted by the training rows that reached each leaf, and a split on feature :math:`j` that
sends the row from node :math:`n` to child :math:`c` adds :math:`E_c - E_n` to feature
:math:`j`. Per row, the contributions add up exactly to
:math:`f(x) - (b + \\sum_k E_{\\mathrm{root}_k})`, the row's departure from the average training
row, in log-odds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["TreeEnsemble"]


@dataclass(frozen=True)
class TreeEnsemble:
    """Trees as concatenated node arrays; ``roots[k]`` is tree *k*'s first node."""

    baseline: float
    roots: NDArray[np.int64]
    feature: NDArray[np.int64]
    threshold: NDArray[np.float64]
    left: NDArray[np.int64]
    right: NDArray[np.int64]
    missing_left: NDArray[np.bool_]
    is_leaf: NDArray[np.bool_]
    value: NDArray[np.float64]
    n_features: int
    count: NDArray[np.float64] | None = None
    """Training rows that reached each node; None for params stored without them (then
    :meth:`contributions` cannot be computed)."""

    @classmethod
    def from_sklearn(cls, model: Any) -> TreeEnsemble:
        """Copy a fitted binary ``HistGradientBoostingClassifier`` (numeric features only).

        Raises
        ------
        ValueError
            If the model is not a binary classifier or splits on categorical features.
        """
        predictors = model._predictors
        if any(len(step) != 1 for step in predictors):
            raise ValueError("only a binary classifier (one tree per iteration) is supported")
        roots, parts, offset = [], [], 0
        for (tree,) in predictors:
            nodes = tree.nodes
            if np.any(nodes["is_categorical"]):
                raise ValueError("categorical splits are not supported")
            roots.append(offset)
            parts.append(nodes)
            offset += len(nodes)
        nodes = np.concatenate(parts) if parts else np.zeros(0, dtype=float)
        shift = np.repeat(np.asarray(roots, dtype=np.int64), [len(p) for p in parts])
        return cls(
            baseline=float(np.ravel(model._baseline_prediction)[0]),
            roots=np.asarray(roots, dtype=np.int64),
            feature=nodes["feature_idx"].astype(np.int64),
            threshold=nodes["num_threshold"].astype(np.float64),
            left=nodes["left"].astype(np.int64) + shift,
            right=nodes["right"].astype(np.int64) + shift,
            missing_left=nodes["missing_go_to_left"].astype(bool),
            is_leaf=nodes["is_leaf"].astype(bool),
            value=nodes["value"].astype(np.float64),
            n_features=int(model.n_features_in_),
            count=nodes["count"].astype(np.float64),
        )

    def _checked(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        x = np.asarray(X, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"X must have {self.n_features} columns, got shape {x.shape}")
        return x

    def _step(
        self, x: NDArray[np.float64], rows: NDArray[np.int64], at: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """The children the rows ``rows`` of ``x`` go to from the split nodes ``at``."""
        v = x[rows, self.feature[at]]
        go_left = np.where(np.isnan(v), self.missing_left[at], v <= self.threshold[at])
        return np.where(go_left, self.left[at], self.right[at])

    def decision_function(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Raw scores :math:`f(x)`, one per row of ``X`` (rows x ``n_features``)."""
        x = self._checked(X)
        rows = np.arange(len(x))
        total = np.full(len(x), self.baseline)
        for root in self.roots:
            node = np.full(len(x), root, dtype=np.int64)
            active = ~self.is_leaf[node]
            while active.any():
                node[active] = self._step(x, rows[active], node[active])
                active = ~self.is_leaf[node]
            total += self.value[node]
        return total

    def _expected_values(self) -> NDArray[np.float64]:
        """:math:`E_n` per node: the count-weighted mean of the leaf values below it."""
        if self.count is None:
            raise ValueError(
                "these trees were stored without node counts, so their contributions cannot "
                "be computed: refit the model"
            )
        expected = np.where(self.is_leaf, self.value, 0.0)
        # Children always come after their parent in a tree's node array, so one backward
        # pass fills every internal node from its finished children.
        for n in np.flatnonzero(~self.is_leaf)[::-1]:
            left, right = self.left[n], self.right[n]
            weight = self.count[left] + self.count[right]
            if weight > 0:
                expected[n] = (
                    self.count[left] * expected[left] + self.count[right] * expected[right]
                ) / weight
            else:
                expected[n] = 0.5 * (expected[left] + expected[right])
        return expected

    def contributions(self, X: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """Path contributions: ``(bias, per-feature contributions)`` with
        ``bias + contributions.sum(axis=1) == decision_function(X)`` (see the module docstring).

        Raises
        ------
        ValueError
            If ``X`` has the wrong shape or the trees carry no node counts.
        """
        x = self._checked(X)
        expected = self._expected_values()
        rows = np.arange(len(x))
        out = np.zeros_like(x)
        for root in self.roots:
            node = np.full(len(x), root, dtype=np.int64)
            active = ~self.is_leaf[node]
            while active.any():
                at = node[active]
                child = self._step(x, rows[active], at)
                np.add.at(out, (rows[active], self.feature[at]), expected[child] - expected[at])
                node[active] = child
                active = ~self.is_leaf[node]
        bias = self.baseline + float(expected[self.roots].sum())
        return bias, out

    def predict_proba(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """:math:`P(y = 1 \\mid x)` per row."""
        out: NDArray[np.float64] = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return out

    def to_params(self) -> dict[str, Any]:
        """JSON-safe dict for :meth:`from_params`."""
        return {
            "baseline": self.baseline,
            "n_features": self.n_features,
            "roots": self.roots.tolist(),
            "feature": self.feature.tolist(),
            "threshold": [float(t) if np.isfinite(t) else None for t in self.threshold],
            "left": self.left.tolist(),
            "right": self.right.tolist(),
            "missing_left": self.missing_left.astype(int).tolist(),
            "is_leaf": self.is_leaf.astype(int).tolist(),
            "value": self.value.tolist(),
            "count": None if self.count is None else self.count.tolist(),
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TreeEnsemble:
        """The ensemble :meth:`to_params` described."""
        threshold = [np.inf if t is None else t for t in params["threshold"]]
        return cls(
            baseline=float(params["baseline"]),
            roots=np.asarray(params["roots"], dtype=np.int64),
            feature=np.asarray(params["feature"], dtype=np.int64),
            threshold=np.asarray(threshold, dtype=np.float64),
            left=np.asarray(params["left"], dtype=np.int64),
            right=np.asarray(params["right"], dtype=np.int64),
            missing_left=np.asarray(params["missing_left"], dtype=bool),
            is_leaf=np.asarray(params["is_leaf"], dtype=bool),
            value=np.asarray(params["value"], dtype=np.float64),
            n_features=int(params["n_features"]),
            count=None if params.get("count") is None else np.asarray(params["count"], np.float64),
        )
