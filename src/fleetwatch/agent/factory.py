"""Building a ready agent from settings: collectors, spool, HTTP client, pusher."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import httpx

from fleetwatch import __version__
from fleetwatch.agent.collectors.base import Collector
from fleetwatch.agent.loop import Agent, read_boot_id
from fleetwatch.agent.push import Pusher
from fleetwatch.agent.selfmetrics import AgentMetrics
from fleetwatch.agent.spool import Spool
from fleetwatch.config import AgentSettings
from fleetwatch.errors import ConfigError
from fleetwatch.telemetry import NodeInfo

__all__ = ["build_agent", "build_collectors", "node_info", "utc_clock"]

logger = logging.getLogger(__name__)


def utc_clock() -> datetime:
    return datetime.now(UTC)


def node_info(settings: AgentSettings) -> NodeInfo:
    return NodeInfo(
        name=settings.node_name,
        labels=settings.labels,
        interval_s=settings.interval_s,
        agent_version=__version__,
        boot_id=settings.boot_id or read_boot_id(),
    )


def build_collectors(
    settings: AgentSettings,
    clock: Callable[[], datetime] = utc_clock,
    *,
    keep_state: bool = True,
) -> list[Collector]:
    """The configured collectors, in the configured order (earlier ones win a shared field).

    ``keep_state=False`` (a dry run) writes nothing: the kernel log is then read from its end
    with no position saved.
    """
    collectors: list[Collector] = []
    state_dir = settings.spool_dir if keep_state else None
    for name in settings.collectors:
        if name == "nvml":
            from fleetwatch.agent.collectors.nvml import NvmlCollector
            from fleetwatch.agent.nvml import Nvml

            collectors.append(NvmlCollector(Nvml()))
        elif name == "dcgm-exporter":
            from fleetwatch.agent.collectors.dcgm_exporter import DcgmExporterCollector

            collectors.append(DcgmExporterCollector(settings.dcgm_url))
        elif name == "nvidia-smi":
            from fleetwatch.agent.collectors.nvidia_smi import NvidiaSmiCollector

            collectors.append(NvidiaSmiCollector(settings.nvidia_smi))
        elif name == "kernel-log":
            from fleetwatch.agent.collectors.kernel_log import KernelLogCollector
            from fleetwatch.agent.kmsg import open_kernel_log

            if state_dir is not None:
                state_dir.mkdir(parents=True, exist_ok=True)
            source = open_kernel_log(settings.kernel_log, state_dir)
            collectors.append(KernelLogCollector(source, clock=clock))
        elif name == "infiniband":
            from fleetwatch.agent.collectors.infiniband import InfinibandCollector

            collectors.append(InfinibandCollector(settings.infiniband_root))
        elif name == "sim":
            from fleetwatch.agent.collectors.sim import SimCollector

            if settings.sim_spec is None:
                raise ConfigError("the sim collector needs sim_spec (from `fleetwatch sim init`)")
            collectors.append(SimCollector.from_spec_file(settings.sim_spec, settings.node_name))
    return collectors


def build_agent(
    settings: AgentSettings,
    metrics: AgentMetrics | None = None,
    collectors: list[Collector] | None = None,
) -> Agent:
    """An agent as configured; ``collectors`` replaces the configured ones (tests, benchmarks)."""
    token = settings.bearer_token()
    if not token:
        raise ConfigError("no token: set --token, --token-file or FLEETWATCH_AGENT_TOKEN")
    refused = settings.plain_http_problem()
    if refused is not None:
        raise ConfigError(refused)
    if settings.token_in_clear():
        logger.warning(
            "sending the agent token in clear over plain HTTP to %s (allow_insecure_http)",
            settings.server_url,
        )
    verify = settings.client_tls().verify()
    metrics = metrics or AgentMetrics()
    spool = Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
    client = httpx.Client(
        base_url=settings.server_url.rstrip("/"),
        headers={
            "Authorization": f"Bearer {token}",
            "User-Agent": f"fleetwatch-agent/{__version__}",
        },
        timeout=settings.push_timeout_s,
        verify=verify,
    )
    pusher = Pusher(
        client,
        spool,
        metrics,
        rejected_dir=settings.spool_dir / "rejected",
        poison_after_s=settings.poison_after_s,
    )
    if collectors is None:
        collectors = build_collectors(settings)
    node = node_info(settings)
    boot_id_source = None
    simulated = [c for c in collectors if c.name == "sim"]
    if simulated:
        # A simulated node has its own place in the fleet (rack, row) and its own reboots.
        sim = simulated[0]
        node = node.model_copy(update={"labels": {**sim.labels, **settings.labels}})  # type: ignore[attr-defined]
        boot_id_source = sim.boot_id  # type: ignore[attr-defined]
    return Agent(
        node=node,
        collectors=collectors,
        spool=spool,
        pusher=pusher,
        metrics=metrics,
        clock=utc_clock,
        boot_id_source=boot_id_source,
        push_interval_s=settings.push_interval_s,
    )
