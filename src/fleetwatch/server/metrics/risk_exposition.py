"""Risk and verdicts on /metrics, from the newest background assessment.

On the default page (all gauges): ``fleetwatch_node_failure_probability{node,horizon}`` for each
horizon of ``risk_horizons_h`` (nodes without a probability are left out, not exported as 0);
``fleetwatch_gpu_verdict{node,gpu,uuid,kind,rule,severity,action}`` = 1 per active verdict about
a GPU, for alert rules (only GPUs with a verdict have one);
``fleetwatch_node_verdict{node,kind,component,rule,severity,action}`` = 1 per active verdict about
a whole node (a host error or a network port: one series, not one per GPU); the fleet's
distribution, ``fleetwatch_gpus{verdict}`` (GPUs by their worst verdict, ``none`` for healthy
ones) and ``fleetwatch_gpus_at_risk{horizon,threshold}`` (GPUs whose probability is at least the
threshold); ``fleetwatch_risk_model_version`` and ``fleetwatch_assessment_timestamp_seconds``.

On a shard's page: ``fleetwatch_gpu_failure_probability{node,gpu,uuid,horizon}`` of the shard's
GPUs (one series per GPU and horizon: 200,000 at 100,000 GPUs, too many for the default page).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment, GpuRisk
from fleetwatch.server.judge.judging import Verdict
from fleetwatch.server.metrics.text import escape_label, family_header

__all__ = ["AT_RISK_THRESHOLDS", "VERDICT_LEVELS", "render_gpu_risk", "render_risk"]

# Worst first is last: a GPU counts under the most severe of its verdicts.
VERDICT_LEVELS = ("none", "info", "warning", "critical", "fatal")
AT_RISK_THRESHOLDS = (0.05, 0.2, 0.5)


def _horizon_label(hours: float) -> str:
    if hours % 24 == 0:
        return f"{int(hours // 24)}d"
    return f"{hours:g}h"


def render_risk(snapshot: FleetAssessment | None, horizons_h: Sequence[float]) -> str:
    """The default page's risk series of ``snapshot``, rendered once per snapshot and horizons
    (a scrape every 15 s would otherwise rebuild them from an unchanged snapshot)."""
    if snapshot is None:
        return ""
    key = "metrics:" + ",".join(f"{h:g}" for h in horizons_h)
    return snapshot.memo(key, lambda: _render(snapshot, horizons_h))


@dataclass(frozen=True, slots=True)
class _NodePart:
    """What one node adds to the default page: computed once per node and snapshot, and
    carried into a snapshot patched for other nodes (an urgent pass patches a node or two every
    few seconds; rendering 100,000 GPUs anew for each cost a quarter of a second)."""

    lines: tuple[str | None, ...]  # per horizon: its failure-probability line (None: unknown)
    at_risk: tuple[tuple[int, ...], ...]  # per horizon, per threshold: GPUs at or above it
    levels: tuple[int, ...]  # GPUs by worst verdict, in VERDICT_LEVELS order
    gpu_verdicts: tuple[str, ...]
    node_verdicts: tuple[str, ...]


def _node_part(
    node: str, risks: Sequence[tuple[float | None, list[GpuRisk]]], labels: Sequence[str]
) -> _NodePart:
    """``risks``: the node's (probability, GPU risks) per horizon, as node_risks gives them;
    one more than ``labels`` when no horizon is configured (the GPUs, grouped)."""
    name = escape_label(node)
    shown = risks[: len(labels)]
    lines = tuple(
        f'fleetwatch_node_failure_probability{{node="{name}",horizon="{label}"}} {p:.6g}\n'
        if p is not None
        else None
        for (p, _), label in zip(shown, labels, strict=True)
    )
    known = [[r.probability for r in m if r.probability is not None] for _, m in shown]
    at_risk = tuple(
        tuple(sum(1 for q in probabilities if q >= t) for t in AT_RISK_THRESHOLDS)
        for probabilities in known
    )
    gpus = [r.gpu for r in risks[0][1]]
    counts = dict.fromkeys(VERDICT_LEVELS, 0)
    if not any(gpu.verdicts for gpu in gpus):
        counts["none"] = len(gpus)
        return _NodePart(lines, at_risk, tuple(counts.values()), (), ())
    for gpu in gpus:
        counts[_worst(gpu)] += 1
    gpu_verdicts = tuple(
        f'fleetwatch_gpu_verdict{{node="{escape_label(g.node)}",gpu="{g.index}",uuid="{g.uuid}",'
        f'kind="{v.kind}",rule="{escape_label(v.rule)}",severity="{v.severity}",'
        f'action="{v.action}"}} 1\n'
        for g in gpus
        for v in g.verdicts
        if not _about_the_node(v)
    )
    node_verdicts = tuple(
        f'fleetwatch_node_verdict{{node="{escape_label(g.node)}",kind="{v.kind}",'
        f'component="{escape_label(str(v.evidence.get("component", "")))}",'
        f'rule="{escape_label(v.rule)}",severity="{v.severity}",action="{v.action}"}} 1\n'
        for g in gpus
        for v in g.verdicts
        if _about_the_node(v)
    )
    return _NodePart(lines, at_risk, tuple(counts.values()), gpu_verdicts, node_verdicts)


def _render(snapshot: FleetAssessment, horizons_h: Sequence[float]) -> str:
    out = [
        family_header(
            "fleetwatch_assessment_timestamp_seconds", "gauge", "When the fleet was last judged."
        ),
        f"fleetwatch_assessment_timestamp_seconds {snapshot.at.timestamp():.3f}\n",
    ]
    if snapshot.model_version is not None:
        out += [
            family_header(
                "fleetwatch_risk_model_version", "gauge", "Version of the risk model in use."
            ),
            f"fleetwatch_risk_model_version {snapshot.model_version}\n",
        ]
    # Every horizon's node risks (cached on the snapshot) group the GPUs by node; with no
    # horizon configured, one of a day does (its probabilities are not shown).
    days = [h / 24.0 for h in horizons_h] or [1.0]
    labels = [_horizon_label(h) for h in horizons_h]
    by_horizon = [snapshot.node_risks(d) for d in days]
    key = "metrics-node:" + ",".join(f"{h:g}" for h in horizons_h)
    parts = snapshot.per_node(
        key, by_horizon[0], lambda node: _node_part(node, [r[node] for r in by_horizon], labels)
    )
    ordered = sorted(parts)
    node_lines = [
        line for i in range(len(labels)) for node in ordered if (line := parts[node].lines[i])
    ]
    at_risk = [
        f'fleetwatch_gpus_at_risk{{horizon="{label}",threshold="{t:g}"}} '
        f"{sum(part.at_risk[i][j] for part in parts.values())}\n"
        for i, label in enumerate(labels)
        for j, t in enumerate(AT_RISK_THRESHOLDS)
    ]
    if node_lines:
        out.append(
            family_header(
                "fleetwatch_node_failure_probability",
                "gauge",
                "P(any GPU of the node fails within the horizon).",
            )
        )
        out.extend(node_lines)
    out.append(
        family_header(
            "fleetwatch_gpus_at_risk",
            "gauge",
            "GPUs whose failure probability within the horizon is at least the threshold "
            "(probability 1 when a rule takes the GPU out).",
        )
    )
    out.extend(at_risk)
    out.append(
        family_header(
            "fleetwatch_gpus",
            "gauge",
            "GPUs judged in the newest assessment, by their worst active verdict "
            "(none, info, warning, critical, fatal).",
        )
    )
    levels = [sum(part.levels[k] for part in parts.values()) for k in range(len(VERDICT_LEVELS))]
    out.extend(
        f'fleetwatch_gpus{{verdict="{level}"}} {n}\n'
        for level, n in zip(VERDICT_LEVELS, levels, strict=True)
    )
    verdicts = [line for part in parts.values() for line in part.gpu_verdicts]
    if verdicts:
        out.append(
            family_header(
                "fleetwatch_gpu_verdict", "gauge", "An active rule verdict about a GPU; always 1."
            )
        )
        out.extend(dict.fromkeys(verdicts))  # two verdicts of one rule are one series
    # A verdict about the node (its switch fabric, a port, its CPUs or memory) is held by each of
    # its GPUs; one series for the node, so that one failed port pages once, not once per GPU.
    node_verdicts = [line for part in parts.values() for line in part.node_verdicts]
    if node_verdicts:
        out.append(
            family_header(
                "fleetwatch_node_verdict",
                "gauge",
                "An active rule verdict about a whole node (NVSwitch fabric, network port, host "
                "CPU or memory); always 1.",
            )
        )
        out.extend(dict.fromkeys(node_verdicts))
    return "".join(out)


def _about_the_node(verdict: Verdict) -> bool:
    return verdict.kind == "host" and verdict.evidence.get("scope") == "node"


def _worst(gpu: GpuAssessment) -> str:
    severities = {v.severity for v in gpu.verdicts}
    return next((s for s in reversed(VERDICT_LEVELS) if s in severities), "none")


def render_gpu_risk(
    snapshot: FleetAssessment | None, horizons_h: Sequence[float], nodes: Collection[str]
) -> str:
    """A shard's ``fleetwatch_gpu_failure_probability``: the GPUs of ``nodes`` (GPUs without a
    probability are left out, not exported as 0)."""
    if snapshot is None:
        return ""
    lines: list[str] = []
    ordered = sorted(nodes)
    for hours in horizons_h:
        label = _horizon_label(hours)
        # The shard's nodes looked up, not every GPU of the fleet filtered: a shard is a 32nd
        # of the fleet, and this walked all 100,000 GPUs' risks per horizon at each scrape.
        by_node = snapshot.node_risks(hours / 24.0)
        for node in ordered:
            found = by_node.get(node)
            if found is None:
                continue
            name = escape_label(node)
            lines.extend(
                f'fleetwatch_gpu_failure_probability{{node="{name}",gpu="{r.gpu.index}",'
                f'uuid="{r.gpu.uuid}",horizon="{label}"}} {r.probability:.6g}\n'
                for r in found[1]
                if r.probability is not None
            )
    if not lines:
        return ""
    header = family_header(
        "fleetwatch_gpu_failure_probability",
        "gauge",
        "P(GPU fails within the horizon); 1 when a rule takes it out of service.",
    )
    return header + "".join(lines)
