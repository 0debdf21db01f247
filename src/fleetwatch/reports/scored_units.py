"""The GPUs a report scores with the risk model in effect at the week's start, as the server
scored them then: each one's age and SKU, its telemetry covariates over the model's window
before the start (from the hourly rollups), and, with a ``location_pattern``, the ``loc_*``
parts of its location. A covariate a GPU lacks is NaN, which the model imputes as it does when
serving; none is made up."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["units_at"]


def units_at(
    in_service: list[Any],
    start: datetime,
    features: dict[str, dict[str, float]],
    location_pattern: str | None = None,
) -> pd.DataFrame:
    """One row per lifetime of ``in_service`` (``installed_at``, ``sku``, ``gpu_uuid``,
    ``location``), at ``start``; ``features``: GPU UUID to its telemetry covariates."""
    import numpy as np
    import pandas as pd

    from fleetwatch.inventory import compile_location_pattern, location_columns
    from fleetwatch.models.telemetry_features import FEATURE_NAMES

    day = 86400.0
    telemetry = [features.get(lt.gpu_uuid or "", {}) for lt in in_service]
    columns: dict[str, Any] = {
        "age_days": [(start - lt.installed_at).total_seconds() / day for lt in in_service],
        "group": [lt.sku for lt in in_service],
        **{name: [c.get(name, np.nan) for c in telemetry] for name in FEATURE_NAMES},
    }
    pattern = compile_location_pattern(location_pattern)
    if pattern is not None:
        columns.update(location_columns((lt.location for lt in in_service), pattern))
    return pd.DataFrame(columns)
