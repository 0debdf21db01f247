"""counter_rates: per-second rates of cumulative counters, never negative, resets made visible."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from fleetwatch.rules.rates import CounterReading, counter_rates

T0 = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def _at(seconds: float, value: int | None, boot: str | None = "b1") -> CounterReading:
    return CounterReading(T0 + timedelta(seconds=seconds), boot, value)


def _summary(out: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(r["per_s"], r["increase"], r["reset"]) for r in out]


def test_counter_rates_monotonic_counter() -> None:
    out = counter_rates([_at(0, 0), _at(10, 10), _at(20, 30), _at(30, 30)])
    assert _summary(out) == [(1.0, 10, False), (2.0, 20, False), (0.0, 0, False)]
    assert [r["ts"] for r in out] == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]


def test_counter_rates_value_drop_is_a_reset_counted_from_zero() -> None:
    out = counter_rates([_at(0, 1000), _at(10, 1010), _at(20, 6)])
    assert _summary(out) == [(1.0, 10, False), (0.6, 6, True)]


def test_counter_rates_boot_change_is_a_reset_even_when_value_rises() -> None:
    out = counter_rates([_at(0, 10, "b1"), _at(10, 40, "b2")])
    assert _summary(out) == [(4.0, 40, True)]


def test_counter_rates_drop_to_zero_after_reboot() -> None:
    out = counter_rates([_at(0, 10, "b1"), _at(10, 0, "b2"), _at(20, 5, "b2")])
    assert _summary(out) == [(0.0, 0, True), (0.5, 5, False)]


@pytest.mark.parametrize(("before", "after"), [(None, "b1"), ("b1", None), (None, None)])
def test_counter_rates_unknown_boot_id_is_not_a_reboot(
    before: str | None, after: str | None
) -> None:
    out = counter_rates([_at(0, 10, before), _at(10, 20, after)])
    assert _summary(out) == [(1.0, 10, False)]


def test_counter_rates_skip_missing_values() -> None:
    out = counter_rates([_at(0, 0), _at(10, None), _at(20, 40), _at(30, None)])
    # The rate spans the gap: 40 over 20 s, stamped at the reading that has a value.
    assert _summary(out) == [(2.0, 40, False)]
    assert out[0]["ts"] == T0 + timedelta(seconds=20)


def test_counter_rates_equal_timestamps_give_no_rate() -> None:
    out = counter_rates([_at(0, 0), _at(0, 5), _at(10, 15)])
    assert _summary(out) == [(1.0, 10, False)]


def test_counter_rates_need_two_values() -> None:
    assert counter_rates([]) == []
    assert counter_rates([_at(0, 5)]) == []
    assert counter_rates([_at(0, None), _at(10, None)]) == []
    assert counter_rates([_at(0, 5), _at(10, None)]) == []


def test_counter_rates_never_negative_and_count_every_increase() -> None:
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    readings, value, boot, t = [], 0, 0, 0.0
    for _ in range(500):
        t += rng.choice([0.5, 1.0, 10.0])
        if rng.random() < 0.05:
            boot += 1
            value = 0
        elif rng.random() < 0.05:
            value = rng.randrange(0, max(value, 1))  # a driver reload without a reboot
        else:
            value += rng.randrange(0, 50)
        readings.append(_at(t, value if rng.random() > 0.1 else None, f"b{boot}"))
    out = counter_rates(readings)
    assert out, f"seed {seed}"
    assert all(r["per_s"] >= 0 and r["increase"] >= 0 for r in out), f"seed {seed}"
    present = [r for r in readings if r.value is not None]
    assert len(out) == len(present) - 1, f"seed {seed}"
