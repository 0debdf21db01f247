"""Reals as readers see them: the float64 of the decimal PostgreSQL prints for a float32.

The samples' reals (temperatures, power, clocks, utilisation) are stored as float32, 7
significant digits, as the ``real`` columns of the row table held them. Readers got them through
psycopg's text loader as the decimal PostgreSQL printed (55.3, not the float32's
55.29999923706055); :func:`as_printed` gives the same float64 from the stored four bytes, so
that rules, rollups and the API see what they saw before (a test holds the two to each other on
real PostgreSQL).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["as_printed"]

# Every float32 at or above this magnitude is an integer; below it, PostgreSQL prints an
# integer-valued real as that integer.
_FLOAT32_INTEGERS = float(2**24)
# Decimal places tried by arithmetic: a float32 below 2**24 has a 24-bit significand and 10**d
# one of d + 1 bits (10**d = 5**d * 2**d, 5**12 < 2**28), so x * 10**d is exact in a float64 for
# d <= 12 and rint of it is the nearest d-place decimal; the division is correctly rounded.
_MAX_PLACES = 12


def as_printed(sent: NDArray[np.float32]) -> NDArray[np.float64]:
    """The float64 of the decimal PostgreSQL prints for each real (its shortest decimal that
    reads back as the same float32), as psycopg's text loader reads it; for every value below
    2**24 in magnitude (the wire bounds every real field to 50,000), equal to
    ``real::text::float8`` (a test holds the two to each other on real PostgreSQL).

    An integer is itself. Otherwise the fewest decimal places d whose nearest d-place decimal
    reads back as the same float32 give the shortest decimal; past ``_MAX_PLACES`` (magnitudes
    below about 1e-5), numpy prints the float32's shortest decimal and reads it back."""
    out = sent.astype(np.float64)
    todo = np.flatnonzero((out != np.floor(out)) & (np.abs(out) < _FLOAT32_INTEGERS))
    for places in range(1, _MAX_PLACES + 1):
        if not todo.size:
            return out
        scale = 10.0**places
        decimal = np.rint(out[todo] * scale) / scale
        same = decimal.astype(np.float32) == sent[todo]
        out[todo[same]] = decimal[same]
        todo = todo[~same]
    if todo.size:
        out[todo] = sent[todo].astype(np.float32).astype(str).astype(np.float64)
    return out
