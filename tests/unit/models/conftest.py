"""Synthetic survival data for the model tests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tests.unit.models.synth import SEED


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(SEED)


@pytest.fixture
def synthetic(rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two groups with different scales and a numeric covariate ``x``; (X, y)."""
    n = 600
    g = rng.integers(0, 2, size=n)
    x = rng.normal(size=n)
    scale = np.exp(6.0 + 0.4 * g - 0.3 * x)
    t = scale * rng.weibull(1.5, size=n)
    y = pd.DataFrame({"duration": np.minimum(t, 900.0), "event": t <= 900.0})
    return pd.DataFrame({"g": g, "x": x}), y
