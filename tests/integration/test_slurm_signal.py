"""``slurm-sync --signal-jobs USR1`` against the real slurmctld (issue 15, opt-in).

No slurmd runs here (see test_slurm_sync.py), so no job can be RUNNING: a job submitted with
``sbatch`` stays PENDING (held, so that is certain). What is tested against the real controller:
the pass with the flag lists the node's running jobs with ``squeue`` (none) and drains the node
as without it; the exact command the adapter issues for a job, ``scancel --signal=USR1 --batch
<job>``, reaches slurmctld, which answers for the pending job (scancel then retries) and refuses
an unknown one; and the adapter gives up on a job scancel keeps retrying instead of holding the
drain."""

from __future__ import annotations

import subprocess
import threading
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


def _submit_held(tmp_path: Path) -> str:
    """A job slurmctld knows and keeps PENDING whatever else the controller is doing (no slurmd
    runs here, and another test may have drained any node), so what scancel hears is fixed."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--nodelist=gpu01", "--output=/dev/null", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _stderr_until(command: list[str], wanted: str, timeout_s: float = 60.0) -> list[str]:
    """The lines ``command`` writes to stderr until one contains ``wanted`` (then it is killed)."""
    lines: list[str] = []
    with subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    ) as process:
        killer = threading.Timer(timeout_s, process.kill)  # a bound, not a measurement
        killer.start()
        try:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line.rstrip())
                if wanted in line:
                    break
        finally:
            killer.cancel()
            process.kill()
    return lines


def test_the_scancel_command_reaches_slurmctld_for_a_submitted_job(
    slurm_env: Path, tmp_path: Path
) -> None:
    job_id = _submit_held(tmp_path)
    signaller = SlurmJobSignaller("USR1", scancel_timeout_s=3.0)
    try:
        assert signaller.command(job_id)[1:] == ["--signal=USR1", "--batch", job_id]
        assert signaller.jobs_on("gpu01") == []  # pending, not running: nothing to signal
        # The adapter's exact command, verbose: slurmctld knows the job and answers that it is
        # pending, which scancel reports as a transitional state and retries.
        said = _stderr_until(["scancel", "-v", *signaller.command(job_id)[1:]], "transitional")
        assert any(line.endswith(f"Signal 10 to batch job {job_id}") for line in said), said
        assert "transitional state" in said[-1]
        # The adapter does not wait out scancel's retries (about 95 s): it names the job as not
        # signalled and goes on to the drain.
        assert "timed out" in signaller.send(job_id)
        unknown = subprocess.run(
            signaller.command("999999"), capture_output=True, text=True, timeout=60
        )
        # ... and slurmctld refuses a job it does not know, naming it.
        assert unknown.returncode != 0 and "999999" in unknown.stderr
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)


def test_a_bad_signal_name_is_refused() -> None:
    from fleetwatch.errors import ConfigError

    with pytest.raises(ConfigError, match="--signal-jobs"):
        SlurmJobSignaller("USR1; rm -rf /")
