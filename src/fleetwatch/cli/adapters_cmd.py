"""``fleetwatch slurm-sync`` and ``fleetwatch k8s-sync``: carry out evictions in a scheduler.

Exit codes with ``--once``: 0 when every eviction was handled (rejections included), 1 when some
action failed (logged), 2 bad flags, 4 the FleetWatch server refused or could not be reached.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from fleetwatch.cli.tls_options import client_tls_options

if TYPE_CHECKING:
    from fleetwatch.adapters.maintenance import MaintenanceSource
    from fleetwatch.adapters.sync import NodeBackend

__all__ = ["k8s_sync", "slurm_sync"]

logger = logging.getLogger(__name__)


def _common(func: click.decorators.FC) -> click.decorators.FC:
    options = [
        click.option(
            "--server",
            "server_url",
            help="FleetWatch server URL [env FLEETWATCH_SCHEDULER_SERVER_URL]",
        ),
        click.option(
            "--token",
            help="Token with scope 'scheduler' (prefer env FLEETWATCH_SCHEDULER_TOKEN)",
        ),
        click.option("--once", is_flag=True, help="One pass, then exit"),
        click.option("--interval", "interval_s", type=float, help="Seconds between passes [5]"),
        click.option(
            "--dry-run", is_flag=True, help="Change nothing anywhere; log what a pass would do"
        ),
        click.option(
            "--lease", "lease_s", type=int, help="Seconds an acked eviction stays ours [300]"
        ),
        click.option(
            "--maintenance",
            "windows",
            is_flag=True,
            help="Also open (and end) FleetWatch maintenance windows for the scheduler's "
            "planned maintenance (Slurm: MAINT reservations; Kubernetes: nodes annotated "
            "fleetwatch.io/maintenance)",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return client_tls_options()(func)


@click.command("slurm-sync")
@_common
@click.option(
    "--scontrol",
    "scontrol_path",
    default="scontrol",
    show_default=True,
    help="scontrol to run; the cluster comes from SLURM_CONF as for any Slurm command",
)
@click.option(
    "--signal-jobs",
    "signal_jobs",
    metavar="SIGNAL",
    help="Before draining a node, send SIGNAL (e.g. USR1) to the jobs running on it "
    "(scancel --signal=SIGNAL --batch <job>), so they can checkpoint first. Off by default",
)
def slurm_sync(scontrol_path: str, signal_jobs: str | None, **common: Any) -> None:
    """Drain Slurm nodes FleetWatch evicts; resume them when FleetWatch returns them."""
    from fleetwatch.adapters.slurm import Scontrol, SlurmBackend

    def backend() -> NodeBackend:
        slurm = SlurmBackend(Scontrol(scontrol_path))
        if not signal_jobs:
            return slurm
        from fleetwatch.adapters.job_signals import SignallingBackend, SlurmJobSignaller

        return cast("NodeBackend", SignallingBackend(slurm, SlurmJobSignaller(signal_jobs)))

    _sync(backend, **common)


@click.command("k8s-sync")
@_common
@click.option(
    "--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="Default: ~/.kube/config"
)
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account")
@click.option(
    "--annotate-pods",
    is_flag=True,
    help="Before cordoning a node, annotate its running pods fleetwatch.io/drain-pending="
    "'<eviction id>: <reason>' so the jobs can checkpoint first. Off by default",
)
def k8s_sync(kubeconfig: str | None, in_cluster: bool, annotate_pods: bool, **common: Any) -> None:
    """Cordon and taint Kubernetes nodes FleetWatch evicts; undo it when they are returned."""
    if kubeconfig and in_cluster:
        raise click.UsageError("--kubeconfig and --in-cluster exclude each other")
    from fleetwatch.adapters.kubernetes import KubernetesBackend, core_api

    def backend() -> NodeBackend:
        api = core_api(kubeconfig, in_cluster)
        nodes = KubernetesBackend(api)
        if not annotate_pods:
            return nodes
        from fleetwatch.adapters.job_signals import KubernetesPodAnnotator, SignallingBackend

        annotator = KubernetesPodAnnotator(cast("Any", api))
        return cast("NodeBackend", SignallingBackend(nodes, annotator))

    _sync(backend, **common)


def _sync(
    make_backend: Callable[[], NodeBackend],
    *,
    once: bool,
    dry_run: bool,
    windows: bool,
    ca_bundle: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    **flags: Any,
) -> None:
    from fleetwatch.adapters.client import SchedulerClient
    from fleetwatch.adapters.settings import load_adapter_settings
    from fleetwatch.adapters.sync import SyncEngine
    from fleetwatch.client_tls import ClientTls

    settings = load_adapter_settings(**flags)
    tls = ClientTls(ca_bundle, client_cert, client_key)
    backend = make_backend()
    client = SchedulerClient.connect(
        settings.server_url, settings.token.get_secret_value(), settings.timeout_s, tls=tls
    )
    source = cast("MaintenanceSource", backend) if windows else None
    engine = SyncEngine(
        client, backend, dry_run=dry_run, lease_s=settings.lease_s, maintenance=source
    )
    try:
        if once:
            report = engine.run_pass()
            if report.errors:
                raise click.ClickException(
                    f"{len(report.errors)} action(s) failed; first: {report.errors[0]}"
                )
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        logger.info(
            "%s sync every %.1f s against %s",
            backend.name,
            settings.interval_s,
            settings.server_url,
        )
        engine.run_forever(stop, settings.interval_s)
    finally:
        client.close()
