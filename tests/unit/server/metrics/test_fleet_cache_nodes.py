"""The /metrics fleet cache's nodes (``metrics/fleet_cache.py``), read as plain tuples on
PostgreSQL: the first refresh reads every node, later ones the nodes whose ``last_seen`` moved
(less the overlap), and what the cache holds is the table, times in UTC. Both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, update

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import nodes
from fleetwatch.server.metrics.fleet_cache import FleetCache
from fleetwatch.server.metrics.shards import node_hash

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _table(db: Database) -> list[tuple[object, ...]]:
    query = select(nodes.c.id, nodes.c.name, nodes.c.interval_s, nodes.c.last_seen, nodes.c.lag_s)
    with db.read() as conn:
        return sorted(tuple(row) for row in conn.execute(query))


def _cached(cache: FleetCache) -> list[tuple[object, ...]]:
    cache.refresh(force=True)
    return sorted((n.id, n.name, n.interval_s, n.last_seen, n.lag_s) for n in cache.nodes())


def test_the_cache_holds_the_nodes_table_as_it_moves(db: Database) -> None:
    with db.write() as conn:
        conn.execute(
            insert(nodes),
            [
                {"name": f"node-{k}", "labels": {}, "interval_s": 10.0, "first_seen": T0,
                 "last_seen": T0 + timedelta(seconds=k), "lag_s": None if k == 0 else 0.25 * k}
                for k in range(6)
            ],
        )  # fmt: skip
    cache = FleetCache(db, ttl_s=0.0, clock=lambda: T0 + timedelta(minutes=5))
    assert _cached(cache) == _table(db)
    assert all(n.last_seen.utcoffset() == timedelta(0) for n in cache.nodes())
    assert {n.hashed for n in cache.nodes()} == {node_hash(f"node-{k}") for k in range(6)}
    with db.write() as conn:  # two pushes later: one node moved, another with a new interval
        conn.execute(
            update(nodes)
            .where(nodes.c.name == "node-2")
            .values(last_seen=T0 + timedelta(minutes=1), lag_s=3.5)
        )
        conn.execute(
            update(nodes)
            .where(nodes.c.name == "node-5")
            .values(last_seen=T0 + timedelta(minutes=2), interval_s=60.0)
        )
    assert _cached(cache) == _table(db)
    assert next(n for n in cache.nodes() if n.name == "node-5").interval_s == 60.0
