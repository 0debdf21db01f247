"""What isolating items costs the alert pass: ``--conditions`` active conditions (default 5,000),
a first pass that opens them all and steady passes that find them still firing, on a fresh
database (PostgreSQL when ``--database-url`` says so).

``--bad 1`` adds one condition the database refuses (NOT NULL): the pass then falls back from one
savepoint for all items to one per item (:mod:`fleetwatch.server.jobs.isolation`), which is what a
pass costs while a bad item is present. ``--compare FILE`` also times the ``_pass`` of another
copy of ``alerting.py`` (e.g. ``git show REV:src/fleetwatch/server/tell/alerting.py > old.py``).

    .venv/bin/python benchmarks/background_isolation.py [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import alerts
from fleetwatch.server.tell.alerting import Alerter
from fleetwatch.server.tell.conditions import Condition


def _conditions(n: int, bad: int) -> dict[str, Condition]:
    found = {}
    for i in range(n):
        node = f"node-{i // 8:05d}"
        key = f"gpu:GPU-{i:08d}:xid_fatal"
        found[key] = Condition(
            key, "xid", "fatal", f"Xid 79 on {node} GPU {i % 8}", "reboot_node",
            {"rule": "xid_fatal", "xids": [79]}, node, f"GPU-{i:08d}", None, None, "c1",
        )  # fmt: skip
    for i in range(bad):
        found[f"bad:{i}"] = Condition(f"bad:{i}", "xid", "fatal", None, None, {})  # type: ignore[arg-type]
    return found


def _time_passes(db: Database, run: Any, active: dict[str, Condition], passes: int) -> list[float]:
    with db.write() as conn:
        conn.execute(delete(alerts))
    took = []
    for _ in range(passes):
        started = time.perf_counter()
        with db.write() as conn:
            run(conn, active, datetime.now(UTC))
        took.append(time.perf_counter() - started)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--conditions", type=int, default=5000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--bad", type=int, default=0)
    parser.add_argument("--compare", default=None, help="another alerting.py to time too")
    args = parser.parse_args()
    url = args.database_url or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    settings = ServerSettings(database_url=url, background_jobs=False, _env_file=None)  # type: ignore[call-arg]
    db = Database(make_engine(settings))
    upgrade(db.engine)
    active = _conditions(args.conditions, args.bad)
    runs: dict[str, Any] = {"isolated": Alerter(db, settings, lambda: None)._pass}
    if args.compare:
        spec = importlib.util.spec_from_file_location("compared_alerting", args.compare)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        runs["compared"] = module.Alerter(db, settings, lambda: None)._pass
    print(f"{db.engine.dialect.name}: {args.conditions} conditions, {args.bad} bad")  # noqa: T201
    for name, run in runs.items():
        took = _time_passes(db, run, active, args.passes)
        steady = statistics.median(took[1:]) if len(took) > 1 else took[0]
        print(f"  {name:>9}: first pass {took[0]:.3f} s, steady pass {steady:.3f} s")  # noqa: T201
    db.dispose()


if __name__ == "__main__":
    main()
