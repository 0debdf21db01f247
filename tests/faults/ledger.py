"""Collected against stored: what real agents say they collected, what the database holds.

An agent logs ``spooled N samples, ...`` once per collection cycle (one batch); the database
holds them in ``gpu_sample_blocks``, read back through the product's reader. A sample is
identified by its GPU and timestamp, so
``lost = collected - distinct stored - still spooled`` and ``duplicated = rows - distinct``.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from fleetwatch.server.repo.sample_reader import read_samples
from tests.integration.live import AgentProcess

__all__ = ["Tally", "tally"]

SPOOLED = re.compile(r"spooled (\d+) samples")
RETRIED = re.compile(r"push of \S+ failed|server answered \d+ for \S+; will retry")


@dataclass(frozen=True)
class Tally:
    batches: int  # collection cycles the agents logged
    collected: int  # samples in them
    rows: int  # samples stored for these nodes
    distinct: int  # distinct (GPU, timestamp) among them
    spooled: int  # batches still in the agents' spools after they stopped
    stored_batches: int  # ingest_batches rows (one per batch id) for these nodes
    failed_pushes: int  # pushes the agents logged as failed and retried: the fault was felt

    @property
    def duplicated(self) -> int:
        return self.rows - self.distinct

    @property
    def lost(self) -> int:
        return self.collected - self.distinct if self.spooled == 0 else -1

    def line(self) -> str:
        return (
            f"{self.batches} batches, {self.collected} samples collected, {self.rows} stored "
            f"({self.distinct} distinct) in {self.stored_batches} batches: lost {self.lost}, "
            f"duplicated {self.duplicated}, still spooled {self.spooled} "
            f"({self.failed_pushes} pushes failed and were retried)"
        )


def tally(database_url: str, agents: list[AgentProcess], logs: dict[str, str]) -> Tally:
    """Count, once the agents have stopped (``logs`` by agent name, from ``AgentProcess.stop``)."""
    counts = [int(n) for agent in agents for n in SPOOLED.findall(logs[agent.name])]
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            node_ids = (
                conn.execute(
                    text("SELECT id FROM nodes WHERE name = ANY(:names)"),
                    {"names": [agent.name for agent in agents]},
                )
                .scalars()
                .all()
            )
            keys = [
                (gpu, ts)
                for chunk in read_samples(conn, (), node_ids=node_ids or [-1])
                for gpu, ts in zip(chunk.gpu_ids.tolist(), chunk.ts_us.tolist(), strict=True)
            ]
            rows, distinct = len(keys), len(set(keys))
            stored_batches = conn.execute(
                text(
                    "SELECT count(*) FROM ingest_batches b JOIN nodes n ON n.id = b.node_id "
                    "WHERE n.name = ANY(:names)"
                ),
                {"names": [agent.name for agent in agents]},
            ).scalar_one()
    finally:
        engine.dispose()
    return Tally(
        batches=len(counts),
        collected=sum(counts),
        rows=int(rows),
        distinct=int(distinct),
        spooled=sum(_spooled(agent.spool_dir) for agent in agents),
        stored_batches=int(stored_batches),
        failed_pushes=sum(len(RETRIED.findall(log)) for log in logs.values()),
    )


def _spooled(spool_dir: Path) -> int:
    with sqlite3.connect(spool_dir / "spool.db") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM batches").fetchone()[0])
