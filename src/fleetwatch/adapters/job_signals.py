"""Opt-in: signal the jobs running on a node when its drain is acked, before the node is held.

``slurm-sync --signal-jobs USR1`` wraps the Slurm backend: for each eviction it holds, it first
lists the jobs running on the node and sends each the signal, so a training job's handler can
checkpoint at its next step boundary before the drain (and the job's end) comes::

    squeue --noheader --nodelist=gpu02 --states=RUNNING --format=%A
    scancel --signal=USR1 --batch <jobid>        # per job: the batch shell gets the signal

(``--batch`` signals the job's batch script, which forwards it as the job chooses, as with
``#SBATCH --signal=B:USR1@<s>``.) A job that cannot be signalled is logged and the drain goes on:
the signal is advice, the drain is the decision. Off by default.

``k8s-sync --annotate-pods`` does the same for Kubernetes: the running pods of the node (field
selector ``spec.nodeName=<node>,status.phase=Running``) get the annotation
``fleetwatch.io/drain-pending: "<eviction id>: <reason>"`` by a JSON merge patch, before the node
is cordoned; a job's sidecar or downward-API volume can watch for it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from typing import Any, Protocol

from fleetwatch.adapters.client import Eviction
from fleetwatch.adapters.sync import BackendError, NodeBackend
from fleetwatch.errors import ConfigError

__all__ = ["POD_ANNOTATION", "KubernetesPodAnnotator", "SignallingBackend", "SlurmJobSignaller"]

POD_ANNOTATION = "fleetwatch.io/drain-pending"
_MERGE_PATCH = "application/merge-patch+json"

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
        scancel_timeout_s: float = 10.0,
    ) -> None:
        if not _SIGNAL.match(signal):
            raise ConfigError(f"--signal-jobs {signal!r}: a signal name like USR1 or a number")
        self.signal_name = signal.removeprefix("SIG")
        found = {
            name: shutil.which(path) for name, path in (("squeue", squeue), ("scancel", scancel))
        }
        missing = [name for name, path in found.items() if path is None]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not found; needed by --signal-jobs")
        self._squeue, self._scancel = found["squeue"] or squeue, found["scancel"] or scancel
        self._timeout_s = timeout_s
        # scancel retries for about 95 s while slurmctld calls the job "in a transitional
        # state" (pending, requeued, completing); a running job answers in well under a second.
        self._scancel_timeout_s = scancel_timeout_s

    def _run(self, *args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=self._timeout_s if timeout_s is None else timeout_s,
                check=False,
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
        return [self._scancel, f"--signal={self.signal_name}", "--batch", job_id]

    def signal(self, eviction: Eviction) -> dict[str, str]:
        return self.signal_node(eviction.node)

    def signal_node(self, node: str) -> dict[str, str]:
        """Each running job of ``node`` and what scancel answered ("" when it succeeded)."""
        answers = {}
        for job_id in self.jobs_on(node):
            answers[job_id] = self.send(job_id)
            if answers[job_id]:
                logger.warning("node %s: job %s not signalled: %s", node, job_id, answers[job_id])
            else:
                logger.info(
                    "node %s: job %s sent SIG%s before the drain", node, job_id, self.signal_name
                )
        return answers

    def send(self, job_id: str) -> str:
        """Signals one job: "" when scancel succeeded, else why not. A job that left RUNNING
        between ``squeue`` and ``scancel`` costs at most ``scancel_timeout_s``, not the drain."""
        try:
            done = self._run(*self.command(job_id), timeout_s=self._scancel_timeout_s)
        except BackendError as exc:
            return str(exc)
        return "" if done.returncode == 0 else (done.stderr.strip() or "failed")


class PodsApi(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` the annotator uses."""

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any: ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kwargs: Any) -> Any: ...


class KubernetesPodAnnotator:
    """Annotates the running pods of a node with the pending drain."""

    def __init__(self, api: PodsApi) -> None:
        self._api = api

    def signal(self, eviction: Eviction) -> dict[str, str]:
        from kubernetes.client.exceptions import ApiException

        selector = f"spec.nodeName={eviction.node},status.phase=Running"
        try:
            listed = self._api.list_pod_for_all_namespaces(
                field_selector=selector, _preload_content=False
            )
        except ApiException as exc:
            raise BackendError(
                f"listing pods of {eviction.node}: {exc.status} {exc.reason}"
            ) from exc
        value = f"{eviction.id}: {eviction.reason}"[:1000]
        body = {"metadata": {"annotations": {POD_ANNOTATION: value}}}
        answers = {}
        for pod in json.loads(listed.data).get("items", []):
            meta = pod.get("metadata", {})
            where = f"{meta.get('namespace')}/{meta.get('name')}"
            try:
                self._api.patch_namespaced_pod(
                    meta["name"],
                    meta["namespace"],
                    body,
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                )
                answers[where] = ""
                logger.info("node %s: pod %s annotated %s", eviction.node, where, POD_ANNOTATION)
            except ApiException as exc:
                answers[where] = f"{exc.status} {exc.reason}"
                logger.warning(
                    "node %s: pod %s not annotated: %s", eviction.node, where, exc.reason
                )
        return answers


class Signaller(Protocol):
    def signal(self, eviction: Eviction) -> dict[str, str]: ...


class SignallingBackend:
    """A ``NodeBackend`` that signals a node's jobs (or annotates its pods), then holds it with
    the wrapped backend; everything else (inspect, release, maintenance, name) is the wrapped
    backend's."""

    def __init__(self, inner: NodeBackend, signaller: Signaller) -> None:
        self._inner = inner
        self.signaller = signaller
        self.signalled: dict[int, dict[str, str]] = {}  # eviction id -> job -> answer

    def hold(self, eviction: Eviction) -> None:
        try:
            self.signalled[eviction.id] = self.signaller.signal(eviction)
        except Exception as exc:  # noqa: BLE001 - advice only: whatever failed, the drain goes on
            logger.warning("node %s: jobs not signalled before the drain: %s", eviction.node, exc)
        self._inner.hold(eviction)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
