"""A real slurmctld on this host for the Slurm tests and benchmarks (no slurmd: the controller
drains and resumes nodes in its own state). Munge and the Debian packages come from
``scripts/ensure-slurm.sh``."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.integration.live import free_port

__all__ = ["SlurmctldFailed", "running_slurmctld"]

_CONF = """\
ClusterName={cluster}
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
ReturnToService=2
SlurmdTimeout=0
SelectType=select/cons_tres
SchedulerType=sched/backfill
StateSaveLocation={root}/state
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmdSpoolDir={root}/spool
SlurmctldLogFile={root}/slurmctld.log
SlurmctldDebug=info
{nodes}
PartitionName=gpu Nodes={partition} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmctldFailed(RuntimeError):
    """slurmctld did not answer ``scontrol ping``; the message ends with its log."""


def _log_tail(root: Path, out: Path) -> str:
    text = out.read_text(errors="replace") if out.exists() else ""
    log = root / "slurmctld.log"
    if log.exists():
        text += "\n--- slurmctld.log ---\n" + log.read_text(errors="replace")
    return "\n".join(text.splitlines()[-40:])


@contextmanager
def running_slurmctld(
    root: Path, *, cluster: str, node_groups: tuple[str, ...], partition: str
) -> Iterator[Path]:
    """Start ``slurmctld -D`` on free ports with state under ``root``; yield its slurm.conf.

    ``node_groups`` are Slurm node names or ranges (``gpu[01-02]``), all at 127.0.0.1 and
    ``State=IDLE``: with UNKNOWN, DRAIN works but RESUME is refused.
    """
    (root / "state").mkdir(parents=True)
    nodes = "\n".join(
        f"NodeName={group} NodeAddr=127.0.0.1 CPUs=1 RealMemory=1000 State=IDLE"
        for group in node_groups
    )
    conf = root / "slurm.conf"
    conf.write_text(_CONF.format(cluster=cluster, ctld_port=free_port(),
                                 slurmd_port=free_port(), root=root, nodes=nodes,
                                 partition=partition))  # fmt: skip
    out = root / "slurmctld.out"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    with out.open("wb") as sink:
        process = subprocess.Popen(
            ["slurmctld", "-D", "-f", str(conf)], stdout=sink, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env)
            if ping.returncode == 0 and "UP" in ping.stdout:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SlurmctldFailed(
                    f"slurmctld did not start (exit {process.poll()}):\n{_log_tail(root, out)}"
                )
            time.sleep(0.2)
        yield conf
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
