"""``fleetwatch import prometheus`` against a real Prometheus holding a month of dcgm-exporter
history (four days of it, read with --since as a month would be).

The history: four series of a captured dcgm-exporter page (datadog's fixture, its lines and
labels as captured: three of one Tesla T4, the throttle reasons of another T4 on another host),
every 20 minutes for 4 days, backfilled with ``promtool tsdb create-blocks-from openmetrics``;
the temperature, PCIe replay counter and throttle reasons vary with time, and the last-Xid gauge
turns from 0 to 79 once. Prometheus (``/usr/bin/prometheus``) serves that TSDB; the import reads
it at the same 20-minute step, so every hour's rollup is known from the values written.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from fleetwatch.cli import main
from fleetwatch.config import ServerSettings
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import gpu_hourly, gpus, nodes
from tests.conftest import require_tool
from tests.integration.live import free_port

PAGE = "fixtures/dcgm_exporter/metrics/datadog__dcgm_tests_fixtures_metrics.txt"
UUID = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
NODE = "424773df46e0"  # the page's Hostname label
# The page was put together from two hosts: its throttle reasons are another T4's.
OTHER_UUID = "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"
OTHER_NODE = "551bdf382151"
STEP = 1200  # seconds between backfilled values, and the import's step
# Four days, not the month the command is for: promtool 2.42 rereads its whole input for each
# two-hour block it writes (30 days took 18-25 s of the test); four still span several of the
# import's day-long chunks.
DAYS = 4
PER_HOUR = 3600 // STEP
XID_AT = 2 * 24 * PER_HOUR + 1  # step index where the last Xid turns from 0 to 79
# The page's series written back: those that vary. promtool 2.42 reads its whole input once per
# 2-hour block (360 for a month), so every series costs seconds.
SERIES = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
)
_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})? (\S+)$")


def _temp(i: int) -> float:
    return 30 + (i * 7) % 53


def _pcie(i: int) -> int:
    return i // 4


def _reasons(i: int) -> int:
    return 0x40 if i % 3 == 0 else 0x1  # HW slowdown (throttled) or GPU idle


def _xid(i: int) -> int:
    return 79 if i >= XID_AT else 0


def _value(name: str, page_value: str, i: int) -> str:
    varying = {
        "DCGM_FI_DEV_GPU_TEMP": _temp,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _pcie,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _reasons,
        "DCGM_FI_DEV_XID_ERRORS": _xid,
    }
    return str(varying[name](i)) if name in varying else page_value


def _openmetrics(page: str, start: datetime, steps: int) -> str:
    """The page's :data:`SERIES`, each at every step from ``start`` (families kept together, as
    OpenMetrics requires; no TYPE lines, so no counter needs a _total sample name)."""
    out = []
    for line in page.splitlines():
        match = _LINE.match(line)
        if match is None or match[1] not in SERIES:
            continue
        name, labels, value = match[1], match[2] or "", match[3]
        for i in range(steps):
            ts = start.timestamp() + i * STEP
            out.append(f"{name}{labels} {_value(name, value, i)} {ts:.0f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.fixture
def prometheus(tmp_path: Path, shared_dir: Path) -> Iterator[tuple[str, datetime]]:
    """Prometheus serving the backfilled month; yields its URL and the first hour of data."""
    binary = require_tool("prometheus")
    promtool = require_tool("promtool")
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=DAYS)
    source = tmp_path / "history.om"
    source.write_text(_openmetrics((shared_dir / PAGE).read_text(), start, DAYS * 24 * PER_HOUR))
    tsdb = tmp_path / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(tsdb)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=400d",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # generous: CI has 2 shared cores
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield url, start
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _expected(hour_index: int) -> dict[str, Any]:
    """What the backfilled values imply for :data:`UUID`'s hour ``hour_index`` hours after the
    start."""
    steps = range(hour_index * PER_HOUR, (hour_index + 1) * PER_HOUR)
    temps = sorted(_temp(i) for i in steps)
    return {
        "samples": PER_HOUR,
        "span_s": float((PER_HOUR - 1) * STEP),
        "temp_max_c": temps[-1],
        "temp_p95_c": temps[math.ceil(0.95 * len(temps)) - 1],
        "pcie_replays": float(_pcie(steps[-1]) - _pcie(steps[0])),
        "throttle_reported": 0,
        "xid_hardware": 1 if XID_AT in steps else 0,
    }


def _expected_other(hour_index: int) -> dict[str, Any]:
    """The same for :data:`OTHER_UUID`, which has only throttle reasons."""
    steps = range(hour_index * PER_HOUR, (hour_index + 1) * PER_HOUR)
    return {
        "samples": PER_HOUR,
        "temp_max_c": None,
        "throttle_reported": PER_HOUR,
        "throttled": sum(1 for i in steps if _reasons(i) & 0x40),
    }


def _rows(url: str) -> dict[tuple[str, datetime], dict[str, Any]]:
    db = Database(make_engine(ServerSettings(database_url=url)))
    try:
        with db.read() as conn:
            rows = conn.execute(select(gpu_hourly)).all()
    finally:
        db.dispose()
    return {(row.gpu_uuid, row.hour): dict(row._mapping) for row in rows}


def test_prometheus_import_writes_a_month_of_rollups_once(
    prometheus: tuple[str, datetime], tmp_path: Path
) -> None:
    prom, start = prometheus
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    kept_hour = start + timedelta(hours=50)  # as if the server had rolled it up itself
    engine = make_engine(ServerSettings(database_url=url))
    try:
        upgrade(engine)
        with engine.begin() as conn:
            own = {**_expected(0), "temp_max_c": 99.0, "samples": 999, "throttled": 0}
            own.update(sbe_errors=None, nvlink_errors=None, remapped_rows=None)
            own.update({f"xid_{c}": 0 for c in ("memory", "interconnect", "power_thermal")})
            own.update(xid_driver_firmware=0, gpu_uuid=UUID, hour=kept_hour, node_id=1)
            conn.execute(gpu_hourly.insert(), own)
    finally:
        engine.dispose()
    args = [
        "import", "prometheus", "--url", prom, "--since", start.isoformat(), "--step", "20m",
        "--database-url", url,
    ]  # fmt: skip
    runner = CliRunner()

    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    hours = DAYS * 24
    assert f"[{DAYS + 1}/{DAYS + 1}]" in result.stderr or f"[{DAYS}/{DAYS}]" in result.stderr
    assert (
        f"4 series of 4 metrics read, 2 GPUs on 2 nodes (2 new), {2 * hours - 1} GPU-hours "
        "written, 1 kept as the server had them\n"
    ) in result.stdout

    rows = _rows(url)
    assert len(rows) == 2 * hours
    assert rows[(UUID, kept_hour)]["samples"] == 999  # the server's own rollup stays
    for index in (0, 1, 24 + 5, XID_AT // PER_HOUR, hours - 1):
        hour = start + timedelta(hours=index)
        row = rows[(UUID, hour)]
        assert {k: row[k] for k in _expected(index)} == _expected(index), index
        other = rows[(OTHER_UUID, hour)]
        assert {k: other[k] for k in _expected_other(index)} == _expected_other(index), index
    assert sum(row["xid_hardware"] for row in rows.values()) == 1

    db = Database(make_engine(ServerSettings(database_url=url)))
    try:
        with db.read() as conn:
            found = conn.execute(
                select(gpus, nodes.c.name.label("node")).join(nodes, nodes.c.id == gpus.c.node_id)
            ).all()
    finally:
        db.dispose()
    identity = {
        row.uuid: (
            row.node,
            row._mapping["index"],
            row.name,
            row.driver_version,
            row.serial,
            row.vbios_version,
        )
        for row in found
    }
    assert identity == {
        UUID: (NODE, 0, "Tesla T4", "460.106.00", None, None),
        OTHER_UUID: (OTHER_NODE, 0, "Tesla T4", "470.182.03", "1565220008176", "90.04.96.00.02"),
    }
    node_ids = {row.uuid: row.node_id for row in found}
    assert all(
        row["node_id"] == node_ids[uuid] for (uuid, h), row in rows.items() if h != kept_hour
    )

    again = runner.invoke(main, args)
    assert again.exit_code == 0, again.output
    assert "(0 new), 0 GPU-hours written" in again.stdout
    assert _rows(url) == rows


def test_prometheus_import_unreachable_and_bad_since(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    runner = CliRunner()
    down = runner.invoke(
        main,
        ["import", "prometheus", "--url", f"http://127.0.0.1:{free_port()}", "--database-url", url],
    )
    assert down.exit_code == 1
    assert "unreachable" in down.stderr
    bad = runner.invoke(main, ["import", "prometheus", "--url", "http://x", "--since", "30 days"])
    assert bad.exit_code == 2
    assert "--since" in bad.stderr
