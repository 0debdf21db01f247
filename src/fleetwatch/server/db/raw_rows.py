"""Plain tuples straight from psycopg, for the reads of every node that run every few seconds.

Through SQLAlchemy each row becomes a ``Row`` and each value goes through its type's result
processing; for 12,500 nodes that was three times the CPU of psycopg's binary cursor alone
(``benchmarks/node_clocks.py``: 108 ms against 35 ms). Only PostgreSQL through psycopg reads
this way; elsewhere the caller reads through SQLAlchemy. Sessions are in UTC (``make_engine``),
so times come back as ``UtcDateTime`` would give them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

__all__ = ["psycopg_rows"]


def psycopg_rows(
    conn: Connection, sql: str, params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]] | None:
    """The rows of ``sql`` (psycopg's ``%(name)s`` parameters) in ``conn``'s transaction, or
    None where ``conn`` is not PostgreSQL through psycopg."""
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        return None
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor(binary=True) as cursor:
        cursor.execute(sql, params or {})
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows
