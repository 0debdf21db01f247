"""Evictions and the fleet drain budget on /metrics, read from the ``evictions`` table per scrape.

Series (all gauges): ``fleetwatch_evictions{state}`` counts evictions by their current state (every
state is exported, 0 included, so alert rules never meet an absent series);
``fleetwatch_draining_nodes`` is the number of nodes with an eviction in a draining state (pending,
acked, completed) and ``fleetwatch_drain_budget_nodes`` the most that may drain at once
(``drain_budget_pct`` of the known nodes, at least one), as the planner computes them.
"""

from __future__ import annotations

import math

from sqlalchemy import distinct, func, select

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, nodes
from fleetwatch.server.repo.evictions import DRAINING_STATES

__all__ = ["EVICTION_STATES", "render_evictions"]

EVICTION_STATES = (
    "pending",
    "acked",
    "completed",
    "returned",
    "paged",
    "recommended",
    "rejected",
    "cancelled",
)


def render_evictions(db: Database, drain_budget_pct: float) -> str:
    with db.read() as conn:
        rows = conn.execute(select(evictions.c.state, func.count()).group_by(evictions.c.state))
        counts: dict[str, int] = {str(state): int(n) for state, n in rows}
        draining = conn.execute(
            select(func.count(distinct(evictions.c.node))).where(
                evictions.c.state.in_(DRAINING_STATES)
            )
        ).scalar_one()
        known = conn.execute(select(func.count()).select_from(nodes)).scalar_one()
    budget = max(1, math.floor(known * drain_budget_pct / 100.0))
    states = [*EVICTION_STATES, *sorted(set(counts) - set(EVICTION_STATES))]
    return "".join(
        [
            "# HELP fleetwatch_evictions Evictions by current state.\n"
            "# TYPE fleetwatch_evictions gauge\n",
            *(f'fleetwatch_evictions{{state="{s}"}} {counts.get(s, 0)}\n' for s in states),
            "# HELP fleetwatch_draining_nodes Nodes with a pending, acked or completed eviction.\n"
            "# TYPE fleetwatch_draining_nodes gauge\n"
            f"fleetwatch_draining_nodes {draining}\n"
            "# HELP fleetwatch_drain_budget_nodes Most nodes allowed to drain at once.\n"
            "# TYPE fleetwatch_drain_budget_nodes gauge\n"
            f"fleetwatch_drain_budget_nodes {budget}\n",
        ]
    )
