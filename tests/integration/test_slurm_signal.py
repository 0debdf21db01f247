"""``slurm-sync --signal-jobs USR1`` against the real slurmctld (issue 15, opt-in).

No slurmd runs here (see test_slurm_sync.py), so no job can be RUNNING: a job submitted with
``sbatch`` stays PENDING. What is tested against the real controller: the pass with the flag lists
the node's running jobs with ``squeue`` (none) and drains the node as without it; and the exact
command the adapter issues for a job, ``scancel --signal=USR1 --batch <job>``, reaches slurmctld,
which answers for a job that is not running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetwatch.adapters.job_signals import SlurmJobSignaller
from tests.integration import test_slurm_sync as base
from tests.integration.test_slurm_sync import Server, eviction, seed, show, sync_once

# The real slurmctld and FleetWatch server of test_slurm_sync.py (fixtures, by assignment).
slurm_conf = base.slurm_conf
slurm_env = base.slurm_env
server = base.server

pytestmark = pytest.mark.slow


def test_signal_jobs_drains_the_node_after_asking_slurm_for_its_jobs(
    slurm_env: Path, server: Server
) -> None:
    eviction_id = seed(server, "gpu04")
    done = sync_once(server, "--signal-jobs", "USR1")
    assert "DRAIN" in show("gpu04")["state"].split("+")
    assert eviction(server, eviction_id)["state"] == "completed"
    assert "not signalled" not in done.stderr  # squeue answered: no running job on gpu04


def test_the_scancel_command_reaches_slurmctld_for_a_submitted_job(
    slurm_env: Path, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodelist=gpu01", "--output=/dev/null", str(script)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    signaller = SlurmJobSignaller("USR1")
    try:
        assert signaller.command(job_id)[1:] == ["--signal=USR1", "--batch", job_id]
        assert signaller.jobs_on("gpu01") == []  # pending, not running: nothing to signal
        answer = subprocess.run(
            signaller.command(job_id), capture_output=True, text=True, timeout=60
        )
        # slurmctld accepts the request for a job it knows (rc 0, nothing on stderr)...
        assert (answer.returncode, answer.stderr) == (0, "")
        unknown = subprocess.run(
            signaller.command("999999"), capture_output=True, text=True, timeout=60
        )
        # ... and refuses one it does not know, naming it.
        assert unknown.returncode != 0 and "999999" in unknown.stderr
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)


def test_a_bad_signal_name_is_refused() -> None:
    from fleetwatch.errors import ConfigError

    with pytest.raises(ConfigError, match="--signal-jobs"):
        SlurmJobSignaller("USR1; rm -rf /")
