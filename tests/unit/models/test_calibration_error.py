"""The backtest's expected calibration error on cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetwatch.models.backtest import ECE_BINS, expected_calibration_error, score_risks


def test_ece_on_a_hand_made_case() -> None:
    # 20 units sorted by risk fall in 10 bins of 2; every bin's gap is worked out below
    risk = np.repeat(np.arange(1, 11) / 20.0, 2)  # 0.05, 0.05, 0.10, 0.10, ..., 0.50, 0.50
    label = np.zeros(20, dtype=bool)
    label[[1, 3, 19]] = True  # bins 1 and 2 have one failure each, bin 10 has one
    gaps = np.abs(np.arange(1, 11) / 20.0 - np.r_[0.5, 0.5, np.zeros(7), 0.5])
    assert expected_calibration_error(risk, label) == pytest.approx(gaps.mean())
    assert ECE_BINS == 10


def test_ece_bins_are_equal_count_and_stable_on_ties() -> None:
    # 5 units in 2 bins: sizes 3 and 2 (numpy.array_split); ties keep their order
    risk = np.array([0.2, 0.2, 0.2, 0.2, 0.6])
    label = np.array([True, False, False, False, True])
    expected = (3 * abs(0.2 - 1 / 3) + 2 * abs(0.4 - 0.5)) / 5
    assert expected_calibration_error(risk, label, bins=2) == pytest.approx(expected)


def test_ece_of_perfect_and_empty() -> None:
    risk = np.r_[np.zeros(50), np.ones(50)]
    assert expected_calibration_error(risk, risk.astype(bool)) == 0.0
    assert math.isnan(expected_calibration_error(np.array([]), np.array([], dtype=bool)))
    with pytest.raises(ValueError, match="bins"):
        expected_calibration_error(risk, risk.astype(bool), bins=0)


def test_score_risks_reports_the_ece() -> None:
    risk = np.array([0.1, 0.2, 0.3, 0.9])
    label = np.array([False, False, True, True])
    m = score_risks(risk, label, np.array([90.0, 90.0, 10.0, 5.0]), k=2)
    assert m.ece == pytest.approx(expected_calibration_error(risk, label))
    assert m.auc == 1.0 and m.precision_at_k == 1.0
