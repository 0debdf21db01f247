"""Kaplan–Meier on a hand-computed product-limit example."""

from __future__ import annotations

import pytest

from fleetwatch.models.kaplan_meier import kaplan_meier


def test_product_limit_estimate_matches_the_hand_computation() -> None:
    # Failures at 2 and 5, censored at 3 and 7: S(2) = 3/4, S(5) = 3/4 * (1 - 1/2) = 3/8.
    km = kaplan_meier([2.0, 3.0, 5.0, 7.0], [True, False, True, False], at_days=(1, 2, 4, 6))
    assert (km.n, km.failures) == (4, 2)
    assert km.survival_at == pytest.approx({1.0: 1.0, 2.0: 0.75, 4.0: 0.75, 6.0: 0.375})
    assert km.median_days == 5.0


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="as many failure flags"):
        kaplan_meier([1.0, 2.0], [True])
