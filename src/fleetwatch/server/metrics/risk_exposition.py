"""Risk and verdicts on /metrics, from the newest background assessment.

Series (all gauges): ``fleetwatch_gpu_failure_probability{node,gpu,uuid,horizon}`` and
``fleetwatch_node_failure_probability{node,horizon}`` for each horizon of ``risk_horizons_h``
(GPUs without a probability are left out, not exported as 0);
``fleetwatch_gpu_verdict{node,gpu,uuid,kind,rule,severity,action}`` = 1 per active verdict, for
alert rules; ``fleetwatch_risk_model_version`` and ``fleetwatch_assessment_timestamp_seconds``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics.exposition import escape_label

__all__ = ["render_risk"]


def _horizon_label(hours: float) -> str:
    if hours % 24 == 0:
        return f"{int(hours // 24)}d"
    return f"{hours:g}h"


def render_risk(snapshot: FleetAssessment | None, horizons_h: Sequence[float]) -> str:
    """The risk series of ``snapshot``, rendered once per snapshot and horizons (a scrape every
    15 s would otherwise rebuild tens of thousands of lines from an unchanged snapshot)."""
    if snapshot is None:
        return ""
    key = "metrics:" + ",".join(f"{h:g}" for h in horizons_h)
    return snapshot.memo(key, lambda: _render(snapshot, horizons_h))


def _render(snapshot: FleetAssessment, horizons_h: Sequence[float]) -> str:
    out = [
        "# HELP fleetwatch_assessment_timestamp_seconds When the fleet was last judged.\n"
        "# TYPE fleetwatch_assessment_timestamp_seconds gauge\n"
        f"fleetwatch_assessment_timestamp_seconds {snapshot.at.timestamp():.3f}\n"
    ]
    if snapshot.model_version is not None:
        out.append(
            "# HELP fleetwatch_risk_model_version Version of the risk model in use.\n"
            "# TYPE fleetwatch_risk_model_version gauge\n"
            f"fleetwatch_risk_model_version {snapshot.model_version}\n"
        )
    gpu_lines: list[str] = []
    node_lines: list[str] = []
    for hours in horizons_h:
        label = _horizon_label(hours)
        for risk in snapshot.risks(hours / 24.0):
            if risk.probability is None:
                continue
            g = risk.gpu
            gpu_lines.append(
                f'fleetwatch_gpu_failure_probability{{node="{escape_label(g.node)}",gpu="{g.index}",'
                f'uuid="{g.uuid}",horizon="{label}"}} {risk.probability:.6g}\n'
            )
        for node, (p, _members) in sorted(snapshot.node_risks(hours / 24.0).items()):
            if p is not None:
                node_lines.append(
                    f'fleetwatch_node_failure_probability{{node="{escape_label(node)}",'
                    f'horizon="{label}"}} {p:.6g}\n'
                )
    if gpu_lines:
        out.append(
            "# HELP fleetwatch_gpu_failure_probability P(GPU fails within the horizon); 1 when a "
            "rule takes it out of service.\n# TYPE fleetwatch_gpu_failure_probability gauge\n"
        )
        out.extend(gpu_lines)
    if node_lines:
        out.append(
            "# HELP fleetwatch_node_failure_probability P(any GPU of the node fails within the "
            "horizon).\n# TYPE fleetwatch_node_failure_probability gauge\n"
        )
        out.extend(node_lines)
    verdicts = [
        f'fleetwatch_gpu_verdict{{node="{escape_label(g.node)}",gpu="{g.index}",uuid="{g.uuid}",'
        f'kind="{v.kind}",rule="{escape_label(v.rule)}",severity="{v.severity}",'
        f'action="{v.action}"}} 1\n'
        for g in snapshot.gpus
        for v in g.verdicts
    ]
    if verdicts:
        out.append(
            "# HELP fleetwatch_gpu_verdict An active rule verdict about a GPU; always 1.\n"
            "# TYPE fleetwatch_gpu_verdict gauge\n"
        )
        out.extend(dict.fromkeys(verdicts))  # two verdicts of one rule are one series
    return "".join(out)
