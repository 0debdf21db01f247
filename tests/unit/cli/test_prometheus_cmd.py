"""``fleetwatch prometheus remote-write-config``: the block docs/prometheus.md shows is what the
command prints, real promtool accepts it, and its keep regex keeps every series FleetWatch reads
and nothing else of dcgm-exporter's profiling or Prometheus' own."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import require_tool

from fleetwatch.cli import main
from fleetwatch.remote_write.series_names import (
    DCGM_METRIC_NAMES,
    NODE_EXPORTER_METRIC_NAMES,
    keep_regex,
)

DOC = Path(__file__).resolve().parents[3] / "docs/prometheus.md"
URL = "http://fleetwatch.example.com:8400"


def _config(*args: str) -> str:
    result = CliRunner().invoke(main, ["prometheus", "remote-write-config", "--url", URL, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_documented_block_is_what_the_command_prints() -> None:
    text = DOC.read_text()
    after = text.split(f"remote-write-config --url {URL}", 1)[1]
    documented = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    printed = _config()
    # The doc indents the block inside a list item; the lines themselves must match.
    assert [line.strip() for line in documented.strip().splitlines()] == [
        line.strip() for line in printed.strip().splitlines()
    ]


@pytest.mark.parametrize("exact", [False, True])
def test_promtool_accepts_the_block_in_a_prometheus_config(tmp_path: Path, exact: bool) -> None:
    promtool = require_tool("promtool")
    token = tmp_path / "fleetwatch.token"
    token.write_text("fwt_example\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("")  # promtool checks that the file exists, not what it holds
    args = ["--credentials-file", str(token), "--ca-file", str(ca)]
    block = _config(*args, *(["--exact"] if exact else []))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "scrape_configs:\n  - job_name: dcgm\n    static_configs:\n"
        "      - targets: ['gpu-1:9400']\n" + block
    )
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("exact", [False, True])
def test_the_keep_regex_keeps_every_series_fleetwatch_reads(exact: bool) -> None:
    keeps = re.compile(f"^(?:{keep_regex(exact=exact)})$")  # Prometheus anchors relabel regexes
    read = DCGM_METRIC_NAMES | NODE_EXPORTER_METRIC_NAMES
    assert len(read) > 80
    assert [name for name in read if not keeps.match(name)] == []
    for foreign in ("up", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "node_cpu_seconds_total"):
        assert not keeps.match(foreign)
    if exact:
        assert not keeps.match("DCGM_FI_DEV_GPU_TEMP_EXTRA")  # names, not prefixes
