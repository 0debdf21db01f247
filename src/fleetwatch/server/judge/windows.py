"""Every GPU's recent samples as the health rules read them, kept column by column in numpy.

The judge keeps about 15 minutes of every GPU's samples (thinned: see
:meth:`~fleetwatch.server.judge.judging.FleetJudge._thinned`), some 37 per GPU at a 10 s interval:
3.7 million samples at 100,000 GPUs. As Python objects that is over 2 GiB per process; here a
sample is one float64 per field the rules read (NaN: not reported), its time in microseconds and
its boot, in arrays sorted by GPU slot, then time. A value float64 cannot hold exactly (an integer
counter past 2**53) is also kept exactly on the side, and handed back as it was read.

Memory: a field's column is stored as float32 while every value in it converts to float32 and back
unchanged (temperatures, flags, small counters: nearly all of them), and turns float64 for good
the first time one does not; readers always get float64, so nothing downstream sees a different
number. Slots are int32. A sample then takes 88 bytes instead of 164 (18 fields): at 100,000 GPUs
about 0.3 GiB instead of 0.6.

:class:`SampleWindows` answers what the judge needs without building objects: the newest sample
per GPU, the columns for the vectorised screen (:mod:`fleetwatch.rules.health_screen`), and, only
for the few GPUs the screen picks, the samples as objects the rules take (:meth:`series`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetwatch.rules.health import BootSample
from fleetwatch.telemetry import GpuSample

__all__ = ["EPOCH", "SampleWindows", "to_us"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_EXACT = float(2**53)  # integers up to this magnitude are exact in a float64
_NO_TIME = np.iinfo(np.int64).min


def to_us(ts: datetime) -> int:
    """Microseconds since the epoch, exactly (a float would round them); a naive ``ts`` is
    UTC (SQLite's timestamps, read without the UTC column type's conversion)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - EPOCH) // _US


def _reading_class(fields: Sequence[str]) -> type:
    """A slotted class for one stored sample as the rules read it: ``uuid``, ``ts`` and
    ``fields``. Only those attributes exist, so a rule that reads a field the windows do not
    keep fails loudly (AttributeError) in the tests instead of reading "not reported"."""

    def __init__(self: Any, uuid: str, ts: datetime, values: Sequence[Any]) -> None:
        self.uuid = uuid
        self.ts = ts
        for name, value in zip(fields, values, strict=True):
            setattr(self, name, value)

    return type("Reading", (), {"__slots__": ("uuid", "ts", *fields), "__init__": __init__})


def _as_floats(column: Sequence[Any]) -> NDArray[np.float64]:
    """Values as float64, None as NaN (True/False as 1/0)."""
    raw = np.array(column, dtype=object)
    missing: NDArray[np.bool_] = raw == None  # noqa: E711 - elementwise, not identity
    if missing.any():
        raw[missing] = np.nan
    return raw.astype(np.float64)


def _narrowed(values: NDArray[np.float64]) -> NDArray[np.floating[Any]]:
    """``values`` as float32 if each converts back to the same float64 (NaN stays NaN), else
    as they are: a reader widening the float32 column gets exactly ``values``."""
    with np.errstate(over="ignore"):  # beyond float32's range: inf, which then differs
        narrow = values.astype(np.float32)
    same = (narrow.astype(np.float64) == values) | np.isnan(values)
    return narrow if bool(same.all()) else values


def _joined(parts: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """One column from parts of it, float32 only if every part is."""
    if all(part.dtype == np.float32 for part in parts):
        return np.concatenate(parts)
    return np.concatenate([part.astype(np.float64, copy=False) for part in parts])


class SampleWindows:
    """The judged fields of every GPU's window, sorted by (slot, time); see the module doc.

    ``kinds`` gives the Python type each field is read back as (``bool``, ``int`` or
    ``float``: what the database returns for its column).
    """

    def __init__(self, fields: Sequence[str], kinds: Sequence[type]) -> None:
        self.fields = tuple(fields)
        self._kinds = tuple(kinds)
        self._column = {name: j for j, name in enumerate(self.fields)}
        self._reading = _reading_class(self.fields)
        self.slot = np.empty(0, np.int32)
        self.ts = np.empty(0, np.int64)
        self.boot = np.empty(0, np.int32)
        # One column per field, float32 while exact (see the module doc).
        self._values: list[NDArray[Any]] = [np.empty(0, np.float32) for _ in self.fields]
        self._boots: list[str | None] = []
        self._boot_codes: dict[str | None, int] = {}
        self._exact: dict[tuple[int, int, int], Any] = {}  # (slot, ts, field) -> value
        self._newest = np.full(0, _NO_TIME, np.int64)  # per slot; _NO_TIME: no sample
        self._pending: list[tuple[Any, ...]] = []  # added, not merged yet
        self.pending = 0  # samples added, not merged yet
        self._segments()

    def __len__(self) -> int:
        return int(self.ts.size)

    def empty_like(self) -> SampleWindows:
        """Empty windows of the same fields."""
        return SampleWindows(self.fields, self._kinds)

    # -- adding and compacting ---------------------------------------------------------------

    def add(
        self,
        slots: Sequence[int],
        stamps: Sequence[datetime],
        boots: Sequence[str | None],
        columns: Sequence[Sequence[Any]],
    ) -> None:
        """Add samples (``columns``: one sequence per field, in :attr:`fields` order); they
        join the windows at the next :meth:`merge` (or :meth:`compact`), which reads everything
        added since the last one as one read in time order."""
        if not slots:
            return
        slot = np.asarray(slots, dtype=np.int32)
        ts = np.fromiter((to_us(t) for t in stamps), np.int64, len(stamps))
        boot = np.fromiter((self._boot_code(b) for b in boots), np.int32, len(boots))
        values = []
        for j, column in enumerate(columns):
            floats = _as_floats(column)
            self._keep_exact(slot, ts, j, floats, column.__getitem__)
            values.append(_narrowed(floats))
        self._pending.append((slot, ts, boot, values))
        self.pending += int(slot.size)

    def add_arrays(
        self,
        slots: NDArray[np.int64],
        ts_us: NDArray[np.int64],
        boots: Sequence[str | None],
        boot_of: NDArray[np.int64],
        values: Sequence[NDArray[np.float64]],
        raw: Sequence[NDArray[Any]],
    ) -> None:
        """:meth:`add` for samples already in arrays (the packed PostgreSQL read): times in
        microseconds, sample ``i``'s boot ``boots[boot_of[i]]``, per field its values as float64
        (NaN: not reported) and as read (``raw``, where float64 cannot hold one exactly)."""
        if not slots.size:
            return
        slot = slots.astype(np.int32)
        codes = np.array([self._boot_code(b) for b in boots], np.int32)
        boot = codes[boot_of] if codes.size else np.empty(0, np.int32)
        narrowed = []
        for j, floats in enumerate(values):
            self._keep_exact(slot, ts_us, j, floats, _item_of(raw[j]))
            narrowed.append(_narrowed(floats))
        self._pending.append((slot, ts_us, boot, narrowed))
        self.pending += int(slot.size)

    def merge(self) -> None:
        """Put the samples added since the last merge into the windows. A sample no newer than
        its GPU's newest one is skipped, as are repeats of a time (the first one read stands):
        both were judged already or are history."""
        if not self._pending:
            return
        pending, self._pending, self.pending = self._pending, [], 0
        slot = np.concatenate([p[0] for p in pending])
        ts = np.concatenate([p[1] for p in pending])
        boot = np.concatenate([p[2] for p in pending])
        values = [_joined([p[3][j] for p in pending]) for j in range(len(self.fields))]
        del pending
        if int(slot.max()) >= self._newest.size:
            grown = np.full(int(slot.max()) + 1, _NO_TIME, np.int64)
            grown[: self._newest.size] = self._newest
            self._newest = grown
        order = np.lexsort((ts, slot))  # stable: equal times keep the order they were read in
        slot, ts, boot = slot[order], ts[order], boot[order]
        repeat = np.zeros(slot.size, dtype=bool)
        repeat[1:] = (slot[1:] == slot[:-1]) & (ts[1:] == ts[:-1])
        keep = (ts > self._newest[slot]) & ~repeat
        if not keep.any():
            return
        chosen = order[keep]
        slot, ts, boot = slot[keep], ts[keep], boot[keep]
        values = [column[chosen] for column in values]
        np.maximum.at(self._newest, slot, ts)
        # Old samples of a slot precede (and are older than) its new ones, and both are sorted
        # by slot: a new sample goes after every old one of its slot or a lower one, and before
        # the rest (the order a stable sort of old then new by slot gives, without sorting).
        old_at = np.arange(self.slot.size) + np.searchsorted(slot, self.slot, side="left")
        new_at = np.arange(slot.size) + np.searchsorted(self.slot, slot, side="right")
        self.slot = _interleaved(self.slot, old_at, slot, new_at)
        self.ts = _interleaved(self.ts, old_at, ts, new_at)
        self.boot = _interleaved(self.boot, old_at, boot, new_at)
        for j, column in enumerate(values):
            self._values[j] = _interleaved(self._values[j], old_at, column, new_at)
        self._segments()

    def compact(self, history_us: int, dense_us: int, step_us: int) -> None:
        """:meth:`merge`, then drop samples older than ``history_us`` before their GPU's
        newest, then thin what is older than ``dense_us`` to one per ``step_us``, exactly as
        ``FleetJudge._thinned`` thins one window (greedy from the oldest sample kept)."""
        self.merge()
        if not self.ts.size:
            return
        newest = np.repeat(self.ts[self.ends - 1], self.ends - self.starts)
        keep = self.ts >= newest - history_us
        if not keep.all():
            self._select(keep)
            newest = newest[keep]
        self._select(self._thinning(newest - dense_us, step_us))

    def subset(self, slots: Sequence[int]) -> SampleWindows:
        """A copy of the windows of ``slots`` alone (same slot numbers), for a pass over a few
        GPUs that must leave these windows as they are (the judge's targeted pass). Merging
        and compacting work window by window, so the copy then evolves exactly as its windows
        would here."""
        self.merge()
        out = SampleWindows(self.fields, self._kinds)
        wanted = np.asarray(sorted(set(slots)), dtype=np.int32)
        # The windows are sorted by slot: each wanted one is a range of the arrays.
        at = np.searchsorted(self.slots, wanted)
        found = at < self.slots.size
        found[found] &= self.slots[at[found]] == wanted[found]
        bounds = zip(self.starts[at[found]].tolist(), self.ends[at[found]].tolist(), strict=True)
        ranges = [np.arange(a, b) for a, b in bounds]
        keep = np.concatenate(ranges) if ranges else np.empty(0, np.int64)
        boots = self.boot[keep]
        for code in np.unique(boots).tolist():
            out._boot_code(self._boots[code])
        remap = np.zeros(max(len(self._boots), 1), np.int32)
        remap[[self._boot_codes[b] for b in out._boots]] = np.arange(len(out._boots))
        out.slot, out.ts, out.boot = self.slot[keep], self.ts[keep], remap[boots]
        out._values = [column[keep] for column in self._values]
        out._newest = np.full(self._newest.size, _NO_TIME, np.int64)
        present = wanted[wanted < self._newest.size]
        out._newest[present] = self._newest[present]
        chosen = set(wanted.tolist())
        out._exact = {k: v for k, v in self._exact.items() if k[0] in chosen}
        out._segments()
        return out

    def _thinning(self, dense_from: NDArray[np.int64], step_us: int) -> NDArray[np.bool_]:
        """Which samples :meth:`FleetJudge._thinned` keeps: every window at once, position by
        position (a window's n-th sample depends on the last one kept before it)."""
        keep = np.zeros(self.ts.size, dtype=bool)
        starts, lengths = self.starts, self.ends - self.starts
        last = np.zeros(starts.size, np.int64)
        for position in range(int(lengths.max(initial=0))):
            active = np.flatnonzero(lengths > position)
            at = starts[active] + position
            t = self.ts[at]
            kept = (t >= dense_from[at]) | (t - last[active] >= step_us) if position else True
            keep[at] = kept
            last[active] = np.where(kept, t, last[active])
        return keep

    def _select(self, keep: NDArray[np.bool_]) -> None:
        if keep.all():
            return
        # One array at a time, each old one let go as its copy is made: the windows are most of
        # the judge's memory (about 0.3 GiB at 100,000 GPUs), and copying every column before
        # letting any go held them twice, at the assessment pass's peak.
        self.slot = self.slot[keep]
        self.ts = self.ts[keep]
        self.boot = self.boot[keep]
        for j, column in enumerate(self._values):
            self._values[j] = column[keep]
        self._segments()
        if self._exact:
            present = set(zip(self.slot.tolist(), self.ts.tolist(), strict=True))
            self._exact = {k: v for k, v in self._exact.items() if k[:2] in present}

    def _segments(self) -> None:
        """Each window's slot and [start, end) in the arrays, for the slots that have one."""
        if not self.slot.size:
            self.slots = self.starts = self.ends = np.empty(0, np.int64)
            return
        first = np.ones(self.slot.size, dtype=bool)
        first[1:] = self.slot[1:] != self.slot[:-1]
        self.starts = np.flatnonzero(first)
        self.ends = np.append(self.starts[1:], self.slot.size)
        self.slots = self.slot[self.starts].astype(np.int64)  # one per window: small

    def _boot_code(self, boot: str | None) -> int:
        code = self._boot_codes.get(boot)
        if code is None:
            code = self._boot_codes[boot] = len(self._boots)
            self._boots.append(boot)
        return code

    def _keep_exact(
        self,
        slot: NDArray[np.int32],
        ts: NDArray[np.int64],
        j: int,
        values: NDArray[np.float64],
        value_as_read: Callable[[int], Any],
    ) -> None:
        big = np.flatnonzero(np.abs(values) >= _EXACT)  # NaN compares False
        for i in big.tolist():
            self._exact[(int(slot[i]), int(ts[i]), j)] = value_as_read(i)

    # -- reading -------------------------------------------------------------------------------

    def has_inexact(self) -> NDArray[np.bool_]:
        """Per window: holds a value float64 cannot represent (the screen must not judge it)."""
        out = np.zeros(self.slots.size, dtype=bool)
        if self._exact:
            flagged = {k[0] for k in self._exact}
            out[np.isin(self.slots, list(flagged))] = True
        return out

    def column(self, name: str) -> NDArray[np.float64]:
        """Field ``name`` of every sample, as float64 (a copy where it is stored as float32)."""
        return self._values[self._column[name]].astype(np.float64, copy=False)

    def columns(self) -> Mapping[str, NDArray[np.float64]]:
        """Every field as :meth:`column` gives it, each widened only when it is read (so a
        reader going field by field holds one float64 column at a time)."""
        return _Columns(self)

    def boots_as_floats(self) -> NDArray[np.float64]:
        """Each sample's boot as a number, NaN where the boot is unknown."""
        out = self.boot.astype(np.float64)
        unknown = self._boot_codes.get(None)
        if unknown is not None:
            out[self.boot == unknown] = np.nan
        return out

    def newest_us(self) -> NDArray[np.int64]:
        """Per window (in :attr:`slots` order): the time of its newest sample."""
        return self.ts[self.ends - 1]

    def value(self, i: int, name: str) -> Any:
        """Sample ``i``'s value of ``name`` as it was read (None: not reported)."""
        j = self._column[name]
        return self._typed(int(self.slot[i]), int(self.ts[i]), j, float(self._values[j][i]))

    def _typed(self, slot: int, ts: int, j: int, value: float) -> Any:
        if value != value:  # NaN
            return None
        if abs(value) >= _EXACT:
            exact = self._exact.get((slot, ts, j))
            if exact is not None:
                return exact
        kind = self._kinds[j]
        return kind(value) if kind is not bool else value != 0.0

    def series(self, window: int, uuid: str) -> list[BootSample]:
        """Window number ``window`` (a position in :attr:`slots`) as the rules take it."""
        out = []
        slot = int(self.slots[window])
        for i in range(int(self.starts[window]), int(self.ends[window])):
            ts = int(self.ts[i])
            row = [float(column[i]) for column in self._values]
            values = [self._typed(slot, ts, j, v) for j, v in enumerate(row)]
            reading = self._reading(uuid, EPOCH + timedelta(microseconds=ts), values)
            out.append(BootSample(self._boots[int(self.boot[i])], _as_sample(reading)))
        return out


class _Columns(Mapping[str, NDArray[np.float64]]):
    def __init__(self, windows: SampleWindows) -> None:
        self._windows = windows

    def __getitem__(self, name: str) -> NDArray[np.float64]:
        return self._windows.column(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._windows.fields)

    def __len__(self) -> int:
        return len(self._windows.fields)


def _interleaved(
    old: NDArray[Any], old_at: NDArray[np.int64], new: NDArray[Any], new_at: NDArray[np.int64]
) -> NDArray[Any]:
    """``old`` and ``new`` placed at ``old_at`` and ``new_at`` of one array (float32 only if
    both are)."""
    out = np.empty(old.size + new.size, np.result_type(old.dtype, new.dtype))
    out[old_at] = old
    out[new_at] = new
    return out


def _item_of(column: NDArray[Any]) -> Callable[[int], Any]:
    """Value ``i`` of ``column`` as a Python int, float or bool (as a row reader gives it)."""
    return lambda i: column[i].item()


def _as_sample(reading: Any) -> GpuSample:
    # The rules take GpuSample-shaped objects; a reading has the attributes they read.
    return reading  # type: ignore[no-any-return]
