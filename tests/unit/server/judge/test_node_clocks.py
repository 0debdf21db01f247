"""``node_clocks`` reads every node's clock; on PostgreSQL straight from psycopg's binary
cursor. What it gives is what SQLAlchemy's typed rows give (names, UTC times, intervals, lags,
a null lag), with and without ``since``, inside the caller's transaction (an uncommitted update
is seen). Both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, update

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import nodes
from fleetwatch.server.judge.silence import NodeClock, node_clocks

T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _typed(conn: object, since: datetime | None = None) -> list[NodeClock]:
    query = select(nodes.c.name, nodes.c.last_seen, nodes.c.interval_s, nodes.c.lag_s)
    if since is not None:
        query = query.where(nodes.c.last_seen >= since)
    return sorted(NodeClock(*row) for row in conn.execute(query))  # type: ignore[attr-defined]


def test_node_clocks_are_the_typed_rows(db: Database) -> None:
    with db.write() as conn:
        conn.execute(
            insert(nodes),
            [
                {"name": f"node-{k}", "labels": {}, "interval_s": 10.0 * (k + 1),
                 "first_seen": T0, "last_seen": T0 + timedelta(seconds=k),
                 "lag_s": None if k % 3 == 0 else k / 4}
                for k in range(12)
            ],
        )  # fmt: skip
    with db.read() as conn:
        clocks = sorted(node_clocks(conn))
        assert clocks == _typed(conn) and len(clocks) == 12
        assert all(c.last_seen.tzinfo is not None and c.last_seen.utcoffset() == timedelta(0)
                   for c in clocks)  # fmt: skip
        assert clocks[0] == NodeClock("node-0", T0, 10.0, None)
        since = T0 + timedelta(seconds=7)
        assert sorted(node_clocks(conn, since)) == _typed(conn, since)
        assert {c.name for c in node_clocks(conn, since)} == {f"node-{k}" for k in range(7, 12)}
    with db.write() as conn:
        conn.execute(update(nodes).where(nodes.c.name == "node-1").values(lag_s=9.5))
        assert NodeClock("node-1", T0 + timedelta(seconds=1), 20.0, 9.5) in node_clocks(conn)
