"""ISO weeks in UTC: ``2026-W48`` is Monday 2026-11-23 00:00 to Monday 2026-11-30 00:00."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from fleetwatch.errors import InvalidInput

__all__ = ["IsoWeek", "parse_week"]

_PATTERN = re.compile(r"^(\d{4})-W(\d{2})$", re.ASCII)
# A report reads the week before too (trends) and ends a week later: years at the calendar's edges
# would overflow a datetime, and nothing FleetWatch stores predates 1970.
FIRST_YEAR, LAST_YEAR = 1970, 9998


@dataclass(frozen=True, order=True)
class IsoWeek:
    year: int
    week: int

    def __str__(self) -> str:
        return f"{self.year:04d}-W{self.week:02d}"

    @property
    def start(self) -> datetime:
        """Monday 00:00 UTC."""
        return datetime.combine(date.fromisocalendar(self.year, self.week, 1), time(), UTC)

    @property
    def end(self) -> datetime:
        """The next Monday 00:00 UTC (exclusive)."""
        return self.start + timedelta(days=7)

    def previous(self) -> IsoWeek:
        return IsoWeek.containing(self.start - timedelta(days=1))

    @classmethod
    def containing(cls, moment: datetime) -> IsoWeek:
        year, week, _ = moment.astimezone(UTC).isocalendar()
        return cls(year, week)

    @classmethod
    def last_complete(cls, now: datetime, delay: timedelta = timedelta(0)) -> IsoWeek:
        """The newest week that ended at least ``delay`` before ``now``."""
        return cls.containing(now - delay - timedelta(days=7))


def parse_week(text: str) -> IsoWeek:
    """``YYYY-Www`` as an :class:`IsoWeek`; anything else is :class:`InvalidInput` on ``week``."""
    match = _PATTERN.match(text.strip())
    problem = "must look like 2026-W48"
    if match:
        year, week = int(match[1]), int(match[2])
        try:
            date.fromisocalendar(year, week, 1)
        except ValueError:
            problem = f"{year} has no ISO week {week}"
        else:
            if FIRST_YEAR <= year <= LAST_YEAR:
                return IsoWeek(year, week)
            problem = f"the year must lie between {FIRST_YEAR} and {LAST_YEAR}"
    raise InvalidInput(f"week {text!r}: {problem}", [{"loc": ["query", "week"], "msg": problem}])
