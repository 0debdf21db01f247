"""The fleet map: one tile per node, a line per rack; above ``node_limit`` nodes one tile per
rack (its worst node's state), a line per row.

States, worst first (:data:`STATES`): a group's tile shows the worst of its nodes, and links to
that node's page, so the tile that draws the eye leads to the node that made it. Nodes without a
``rack`` label are grouped by name, ``chunk`` at a time, so a fleet with no labels still draws
as blocks instead of one line of 12,500 tiles.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from fleetwatch.charts.svg import attr, document, num, text

__all__ = ["STATES", "WORDS", "MapNode", "fleet_map_svg", "node_href", "state_counts", "worst"]

# (state, words, fill), worst first.
STATES: tuple[tuple[str, str, str], ...] = (
    ("unreachable", "unreachable", "#1d2330"),
    ("out", "out by rule", "#d92d20"),
    ("at_risk", "at risk", "#f79009"),
    ("draining", "draining", "#7a5af8"),
    ("unheard", "not heard since the server started", "#c4c9d2"),
    ("maintenance", "in maintenance", "#53b1fd"),
    ("healthy", "healthy", "#32d583"),
)
_RANK = {state: i for i, (state, _, _) in enumerate(STATES)}
WORDS = {state: words for state, words, _ in STATES}
FILL = {state: fill for state, _, fill in STATES}
NO_RACK = "(no rack label)"
NO_ROW = "(no row label)"

_WIDTH = 1200
_LABEL_W = 110
_TILE = 14
_STEP = 16
_LINE = 18
_PER_LINE = (_WIDTH - _LABEL_W) // _STEP


@dataclass(frozen=True)
class MapNode:
    name: str
    state: str  # one of STATES
    rack: str | None = None
    row: str | None = None


def node_href(name: str) -> str:
    return f"/nodes/{quote(name, safe='')}"


def worst(states: Iterable[str]) -> str:
    """The worst of ``states`` (healthy when there are none)."""
    return min(states, key=_RANK.__getitem__, default="healthy")


def state_counts(nodes: Iterable[MapNode]) -> dict[str, int]:
    """Nodes in each state, every state present (0 when none), worst first."""
    counted = Counter(n.state for n in nodes)
    return {state: counted.get(state, 0) for state, _, _ in STATES}


def _natural(name: str) -> tuple[object, ...]:
    """``r2`` before ``r10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _racks(nodes: Sequence[MapNode], chunk: int) -> dict[str, list[MapNode]]:
    """Nodes by rack, racks and nodes in natural order; unlabelled nodes ``chunk`` at a time."""
    by_rack: dict[str, list[MapNode]] = {}
    loose: list[MapNode] = []
    for node in nodes:
        if node.rack:
            by_rack.setdefault(node.rack, []).append(node)
        else:
            loose.append(node)
    out = {rack: sorted(by_rack[rack], key=lambda n: _natural(n.name)) for rack in by_rack}
    out = dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))
    loose.sort(key=lambda n: _natural(n.name))
    if len(loose) <= chunk:
        if loose:
            out[NO_RACK] = loose
        return out
    for i in range(0, len(loose), chunk):
        part = loose[i : i + chunk]
        out[f"{part[0].name} … {part[-1].name}"] = part
    return out


def _tile(x: float, y: float, state: str, href: str, title: str, data: str) -> str:
    return (
        f'<a href="{attr(href)}"><rect x="{num(x)}" y="{num(y)}" width="{_TILE}" '
        f'height="{_TILE}" rx="2" fill="{FILL[state]}" class="tile s-{state}" '
        f'data-state="{state}" {data}><title>{attr(title)}</title></rect></a>'
    )


def _lines(
    groups: dict[str, list[tuple[str, str, str, str]]], y0: float
) -> tuple[list[str], float]:
    """Each group: its label, then its tiles, wrapped; returns the marks and the next y."""
    marks: list[str] = []
    y = y0
    for label, tiles in groups.items():
        shown = label if len(label) <= 17 else label[:16] + "…"
        marks.append(text(0, y + 11, shown))
        for i, (state, href, title, data) in enumerate(tiles):
            if i and i % _PER_LINE == 0:
                y += _LINE
            marks.append(_tile(_LABEL_W + (i % _PER_LINE) * _STEP, y, state, href, title, data))
        y += _LINE
    return marks, y


def _legend(counts: dict[str, int], y: float) -> tuple[list[str], float]:
    marks = []
    x = 0.0
    for state, words, fill in STATES:
        count = counts[state]
        if state == "unheard" and not count:
            continue  # only a server that just started has any
        label = f"{words} {count}"
        if x + 24 + 7 * len(label) > _WIDTH:
            x, y = 0.0, y + _LINE
        marks.append(
            f'<g class="legend" data-state="{state}" data-count="{count}">'
            f'<rect x="{num(x)}" y="{num(y)}" width="{_TILE}" height="{_TILE}" rx="2" '
            f'fill="{fill}"/>{text(x + 18, y + 11, label)}</g>'
        )
        x += 24 + 7 * len(label) + 12
    return marks, y + _LINE


def fleet_map_svg(
    nodes: Sequence[MapNode],
    *,
    node_limit: int = 1024,
    chunk: int = 32,
    href: Callable[[str], str] = node_href,
) -> str:
    """The map of ``nodes`` with a legend of counts; per node up to ``node_limit`` nodes, else
    per rack (see the module's docstring)."""
    counts = state_counts(nodes)
    racks = _racks(nodes, chunk)
    groups: dict[str, list[tuple[str, str, str, str]]] = {}
    if len(nodes) <= node_limit:
        level = "node"
        for rack, members in racks.items():
            groups[rack] = [
                (
                    n.state,
                    href(n.name),
                    f"{n.name}: {WORDS[n.state]}",
                    f'data-node="{attr(n.name)}"',
                )
                for n in members
            ]
    else:
        level = "rack"
        by_row: dict[str, list[tuple[str, list[MapNode]]]] = {}
        for rack, members in racks.items():
            rows = Counter(n.row for n in members if n.row)
            row = rows.most_common(1)[0][0] if rows else NO_ROW
            by_row.setdefault(str(row), []).append((rack, members))
        for row in sorted(by_row, key=_natural):
            label = row if row == NO_ROW else f"row {row}"
            groups[label] = [_rack_tile(rack, members, href) for rack, members in by_row[row]]
    marks, y = _lines(groups, 0)
    legend, height = _legend(counts, y + 6)
    what = f"fleet map: {len(nodes)} nodes, one tile per {level}"
    return document(_WIDTH, max(height, _LINE), what, marks + legend, kind=f"fleet-map per-{level}")


def _rack_tile(
    rack: str, members: list[MapNode], href: Callable[[str], str]
) -> tuple[str, str, str, str]:
    state = worst(n.state for n in members)
    culprit = next(n for n in members if n.state == state)
    tally = Counter(n.state for n in members)
    parts = ", ".join(f"{tally[s]} {WORDS[s]}" for s, _, _ in STATES if tally[s])
    title = f"{rack}: {len(members)} nodes ({parts}); opens {culprit.name}"
    data = f'data-rack="{attr(rack)}" data-nodes="{len(members)}" data-node="{attr(culprit.name)}"'
    return state, href(culprit.name), title, data
