"""Opt-in: signal the jobs running on a node when its drain is acked, before the node is held.

``slurm-sync --signal-jobs USR1`` wraps the Slurm backend: for each eviction it holds, it first
lists the jobs running on the node and sends each the signal, so a training job's handler can
checkpoint at its next step boundary before the drain (and the job's end) comes::

    squeue --noheader --nodelist=gpu02 --states=RUNNING --format=%A
    scancel --signal=USR1 --batch <jobid>        # per job: the batch shell gets the signal

(``--batch`` signals the job's batch script, which forwards it as the job chooses, as with
``#SBATCH --signal=B:USR1@<s>``.) A job that cannot be signalled is logged and the drain goes on:
the signal is advice, the drain is the decision. Off by default.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from typing import Any

from fleetwatch.adapters.client import Eviction
from fleetwatch.adapters.sync import BackendError, NodeBackend
from fleetwatch.errors import ConfigError

__all__ = ["SignallingBackend", "SlurmJobSignaller"]

logger = logging.getLogger(__name__)

_SIGNAL = re.compile(r"^(SIG)?[A-Z0-9]{2,8}$|^[0-9]{1,2}$")
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


class SlurmJobSignaller:
    """Finds the running jobs of a node with ``squeue`` and signals them with ``scancel``."""

    def __init__(
        self,
        signal: str,
        *,
        squeue: str = "squeue",
        scancel: str = "scancel",
        timeout_s: float = 30.0,
    ) -> None:
        if not _SIGNAL.match(signal):
            raise ConfigError(f"--signal-jobs {signal!r}: a signal name like USR1 or a number")
        self.signal = signal.removeprefix("SIG")
        found = {
            name: shutil.which(path) for name, path in (("squeue", squeue), ("scancel", scancel))
        }
        missing = [name for name, path in found.items() if path is None]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not found; needed by --signal-jobs")
        self._squeue, self._scancel = found["squeue"] or squeue, found["scancel"] or scancel
        self._timeout_s = timeout_s

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                args, capture_output=True, text=True, timeout=self._timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{args[0]} failed: {exc}") from exc

    def jobs_on(self, node: str) -> list[str]:
        done = self._run(
            self._squeue, "--noheader", f"--nodelist={node}", "--states=RUNNING", "--format=%A"
        )
        if done.returncode != 0:
            raise BackendError(f"squeue: {done.stderr.strip() or done.returncode}")
        return [j for j in (line.strip() for line in done.stdout.splitlines()) if _JOB_ID.match(j)]

    def command(self, job_id: str) -> list[str]:
        return [self._scancel, f"--signal={self.signal}", "--batch", job_id]

    def signal_node(self, node: str) -> dict[str, str]:
        """Each running job of ``node`` and what scancel answered ("" when it succeeded)."""
        answers = {}
        for job_id in self.jobs_on(node):
            done = self._run(*self.command(job_id))
            answers[job_id] = "" if done.returncode == 0 else (done.stderr.strip() or "failed")
            if done.returncode == 0:
                logger.info(
                    "node %s: job %s sent SIG%s before the drain", node, job_id, self.signal
                )
            else:
                logger.warning("node %s: job %s not signalled: %s", node, job_id, answers[job_id])
        return answers


class SignallingBackend:
    """A ``NodeBackend`` that signals a node's jobs, then holds it with the wrapped backend;
    everything else (inspect, release, maintenance, name) is the wrapped backend's."""

    def __init__(self, inner: NodeBackend, signaller: SlurmJobSignaller) -> None:
        self._inner = inner
        self.signaller = signaller
        self.signalled: dict[int, dict[str, str]] = {}  # eviction id -> job -> answer

    def hold(self, eviction: Eviction) -> None:
        try:
            self.signalled[eviction.id] = self.signaller.signal_node(eviction.node)
        except BackendError as exc:  # advice only: the drain goes on
            logger.warning("node %s: jobs not signalled before the drain: %s", eviction.node, exc)
        self._inner.hold(eviction)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
