"""``model backtest``: CSV, printed metrics and one-line errors, on Titan and synthetic records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner, Result

from fleetwatch.cli.model_cmd import model
from fleetwatch.models.features import failures_in_window, read_titan, survival_frame

METRIC_ROWS = ("AUC", "average precision", "ECE", "precision@100", "(1%)", "concordance")
RISK_COLUMNS = ("risk", "risk_aft", "risk_age_only", "risk_location_only")
SLICE_COLUMNS = ("c0-", "c1-", "c2-")


def _run(*args: str) -> Result:
    return CliRunner().invoke(model, ["backtest", *args])


@pytest.fixture(scope="module")
def titan_path(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Titan's gc_full.csv cut to cabinet columns 0-2 (an eighth of the machine), so that the
    landmark model's fit stays a few seconds; the file keeps Titan's own format."""
    path = shared_dir / "datasets" / "titan" / "gc_full.csv"
    if not path.is_file():
        pytest.skip(f"Titan data not found at {path}")
    lines = path.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines[1:] if ln.split(",")[1].startswith(SLICE_COLUMNS)]
    sliced = tmp_path_factory.mktemp("titan") / "gc_slice.csv"
    sliced.write_text(lines[0] + "".join(kept))
    return sliced


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Inventory records (serial, location, inserted, removed, event) for 600 units."""
    rng = np.random.default_rng(20260501)
    n = 600
    start = pd.Timestamp("2015-01-01") + pd.to_timedelta(rng.integers(0, 200, n), unit="D")
    cage = rng.integers(0, 3, n)
    life = np.exp(6.3 - 0.4 * cage) * rng.weibull(1.3, n)
    end_of_data = pd.Timestamp("2019-01-01")
    fail = pd.Series(start + pd.to_timedelta(life, unit="D"))
    failed = (fail < end_of_data).to_numpy()
    records = pd.DataFrame(
        {
            "serial": [f"S{i:05d}" for i in range(n)],
            "location": [
                f"c{rng.integers(0, 25)}-{rng.integers(0, 8)}c{c}"
                f"s{rng.integers(0, 8)}n{rng.integers(0, 4)}"
                for c in cage
            ],
            "inserted": start,
            "removed": fail.where(failed, end_of_data).dt.floor("s"),
            "event": ["DBE" if f else None for f in failed],
        }
    )
    path = tmp_path_factory.mktemp("inv") / "inventory.csv"
    records.to_csv(path, index=False)
    return path


def _assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code != 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("[model backtest]")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


def test_titan_backtest_writes_one_row_per_unit_in_service(
    titan_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "risk.csv"
    result = _run(
        "--inventory", str(titan_path), "--cutoff", "2017-01-01",
        "--horizon", "180", "--horizon", "90", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    table = pd.read_csv(out, dtype={"serial": str})
    records = read_titan(titan_path)
    frame = survival_frame(records, "2017-01-01")
    in_service = frame.index[frame["in_service"]]
    assert table["serial"].is_unique
    assert set(table["serial"]) == set(in_service) and len(table) == len(in_service)
    for col in ("serial", "age_days", "failed_in_window", "days_to_failure", *RISK_COLUMNS):
        assert col in table.columns
    for col in (*RISK_COLUMNS, *(f"{c}_90d" for c in RISK_COLUMNS)):
        assert table[col].between(0.0, 1.0).all(), col
    assert (table["age_days"] > 0).all()
    # the first horizon (180 d) is the unsuffixed one; labels match the records
    hits = failures_in_window(
        records, "2017-01-01", pd.Timestamp("2017-01-01") + pd.Timedelta(days=180)
    )
    assert int(table["failed_in_window"].sum()) == int(hits.index.isin(in_service).sum())
    assert table["failed_in_window_90d"].sum() <= table["failed_in_window"].sum()
    # a longer horizon never lowers a unit's risk
    assert (table["risk"] >= table["risk_90d"] - 1e-9).all()

    out_text = result.stdout
    assert out_text.count("horizon 180 days") == 1 and out_text.count("horizon 90 days") == 1
    for row in METRIC_ROWS:
        assert out_text.count(row) == 2, row
    header = next(ln for ln in out_text.splitlines() if ln.startswith("metric"))
    assert header.split() == ["metric", "model", "aft", "age_only", "location_only"]
    auc_line = next(ln for ln in out_text.splitlines() if ln.startswith("AUC"))
    aucs = [float(v) for v in auc_line.split()[1:]]
    assert len(aucs) == 4 and aucs[0] > 0.5 and all(0 <= v <= 1 for v in aucs)
    ece_line = next(ln for ln in out_text.splitlines() if ln.startswith("ECE"))
    eces = [float(v) for v in ece_line.split()[-4:]]
    assert all(0 <= v <= 1 for v in eces)
    assert "[model backtest]" in result.stderr and "wrote" in result.stderr


def test_generic_record_csv(synth_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "risk.csv"
    result = _run(
        "--inventory", str(synth_path), "--cutoff", "2016-06-01", "--horizon", "180",
        "--out", str(out), "--penalizer", "0.1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out)
    assert list(table.columns[:3]) == ["serial", "age_days", "risk"]
    assert table["risk"].between(0, 1).all()
    assert "(1%)" in result.stdout and "AUC" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--cutoff", "2016-13-45"], ["not a date"]),
        (["--cutoff", "yesterday-ish"], ["not a date"]),
        (["--cutoff", "2014-01-01"], ["not after the first insertion"]),
        (["--cutoff", "2018-12-01"], ["past the end of the data"]),
        (["--cutoff", "2030-01-01"], ["past the end of the data"]),
        (["--cutoff", "2016-06-01", "--horizon", "0"], ["positive number of days"]),
        (["--cutoff", "2016-06-01", "--penalizer", "-1"], ["--penalizer"]),
    ],
)
def test_bad_arguments_fail_with_one_line(
    synth_path: Path, tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    base = ["--inventory", str(synth_path), "--out", str(tmp_path / "o.csv")]
    if "--horizon" not in args:
        base += ["--horizon", "90"]
    result = _run(*base, *args)
    _assert_one_line_error(result, *fragments)
    assert not (tmp_path / "o.csv").exists()


def test_unreadable_inventories_fail_with_one_line(tmp_path: Path) -> None:
    common = ["--cutoff", "2016-06-01", "--horizon", "90", "--out", str(tmp_path / "o.csv")]
    _assert_one_line_error(
        _run("--inventory", str(tmp_path / "missing.csv"), *common), "does not exist"
    )
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    _assert_one_line_error(_run("--inventory", str(wrong), *common), "need Titan's")
    garbled = tmp_path / "garbled.csv"
    garbled.write_text(
        "SN,location,insert,remove,duration,out,event\n1,c1-0c0s0n0,soon,later,1,F,\n"
    )
    _assert_one_line_error(_run("--inventory", str(garbled), *common), "cannot read inventory")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81\x00" * 50)
    _assert_one_line_error(_run("--inventory", str(binary), *common))
