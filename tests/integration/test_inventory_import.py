"""The full Titan inventory through ``fleetwatch inventory import`` into a fresh SQLite file."""

from __future__ import annotations

import csv
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import func, select

from fleetwatch.cli.inventory_cmd import inventory
from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import gpu_lifetimes


def _titan(shared_dir: Path) -> Path:
    return shared_dir / "datasets" / "titan" / "gc_full.csv"


def test_inventory_import_full_titan_file(shared_dir: Path, tmp_path: Path) -> None:
    path = _titan(shared_dir)
    with path.open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    url = f"sqlite:///{tmp_path / 'titan.db'}"
    runner = CliRunner()

    # How long this takes is the benchmarks' business; here only what was stored counts.
    result = runner.invoke(inventory, ["import", str(path), "--database-url", url])
    assert result.exit_code == 0, result.output

    rejected = sum(1 for row in rows if not row["insert"])  # event notes without a stint
    expected = len(rows) - rejected
    assert (
        f"{len(rows)} rows, {expected} lifetimes stored, 0 already stored, {rejected} rejected"
        in (result.output)
    )
    assert "importing" in result.output  # the progress bar, on stderr

    db = Database(make_engine(ServerSettings(database_url=url)))
    try:
        with db.read() as conn:
            count = conn.execute(select(func.count()).select_from(gpu_lifetimes)).scalar_one()
            failures = conn.execute(
                select(gpu_lifetimes.c.cause, func.count())
                .where(gpu_lifetimes.c.end_kind == "failure")
                .group_by(gpu_lifetimes.c.cause)
            ).all()
    finally:
        db.dispose()
    assert count == expected
    want: dict[str, int] = {}
    for row in rows:
        if row["insert"] and row["event"]:
            want[row["event"]] = want.get(row["event"], 0) + 1
    assert dict(failures) == want  # every failure carries its cause: DBE, OTB

    again = runner.invoke(inventory, ["import", str(path), "--database-url", url])
    assert again.exit_code == 0, again.output
    assert f"0 lifetimes stored, {expected} already stored" in again.output


def test_inventory_import_strict_and_bad_mapping(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    path = tmp_path / "in.csv"
    path.write_text("serial,insert,remove\nA,2020-01-01,\nB,nope,\n")
    runner = CliRunner()
    strict = runner.invoke(
        inventory,
        [
            "import",
            str(path),
            "--database-url",
            url,
            "--map",
            "serial=serial",
            "--map",
            "location=",
            "--map",
            "event=",
            "--strict",
        ],
    )
    assert strict.exit_code == 1, strict.output
    assert "line 3" in strict.output and "nothing was stored" in strict.output
    bad = runner.invoke(inventory, ["import", str(path), "--database-url", url])
    assert bad.exit_code == 1 and "'SN' (serial)" in bad.output
    ok = runner.invoke(
        inventory,
        [
            "import",
            str(path),
            "--database-url",
            url,
            "--map",
            "serial=serial",
            "--map",
            "location=",
            "--map",
            "event=",
        ],
    )
    assert ok.exit_code == 0 and "1 lifetimes stored" in ok.output and "1 rejected" in ok.output


def test_inventory_record_closes_and_refuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    path = tmp_path / "in.csv"
    path.write_text("SN,location,insert,remove,event\nA,c1-1c0s0n0,2020-01-01,,\n")
    runner = CliRunner()
    assert runner.invoke(inventory, ["import", str(path), "--database-url", url]).exit_code == 0
    done = runner.invoke(
        inventory,
        [
            "record",
            "A",
            "--kind",
            "failure",
            "--cause",
            "DBE",
            "--at",
            "2021-01-01",
            "--database-url",
            url,
        ],
    )
    assert done.exit_code == 0, done.output
    assert "failure at 2021-01-01 00:00:00Z (import)" in done.output
    missing = runner.invoke(inventory, ["record", "Z", "--kind", "repair", "--database-url", url])
    assert missing.exit_code == 1 and "'Z' not found" in missing.output
    bad_time = runner.invoke(
        inventory, ["record", "A", "--kind", "repair", "--at", "soon", "--database-url", url]
    )
    assert bad_time.exit_code == 2 and "ISO 8601" in bad_time.output
