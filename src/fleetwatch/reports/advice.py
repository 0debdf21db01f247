"""One line per section of the weekly report: what to do about what it shows.

Each line is read off the section's own figures, so it changes with them: a missed SLA names
where the downtime is, a clean week says there is nothing to do. The runbooks
(``docs/runbooks/``) say how; these lines say where to start.
"""

from __future__ import annotations

from typing import Any

from fleetwatch.reports.components import COMPONENT_NAMES

__all__ = ["section_advice"]


def section_advice(r: Any) -> dict[str, str]:
    """Section -> one line, for the report ``r`` (a WeeklyReport)."""
    return {
        "fleet": _fleet(r.fleet_states),
        "sla": _sla(r.sla),
        "availability": _availability(r.availability),
        "notices": _notices(r.notice_savings),
        "reliability": _reliability(r.deltas),
        "deltas": _deltas(r.deltas),
        "goodput": _goodput(r.goodput),
        "drains": _drains(r.drains),
        "interruptions": _interruptions(r.interruptions),
        "calibration": _calibration(r.calibration),
        "offenders": _offenders(r.offenders),
        "survival": _survival(r.survival),
        "stragglers": _stragglers(r.stragglers),
    }


def _fleet(states: list[dict[str, Any]] | None) -> str:
    if not states:
        return "No node reported in the week: check that agents or Prometheus send to the server."
    out = [s["node"] for s in states if s["state"] == "out"]
    draining = sum(1 for s in states if s["state"] == "draining")
    if out:
        return (
            f"{len(out)} node(s) ended the week with a failed GPU not back in service "
            f"(first: {out[0]}): check that each is with repair (runbooks/xid.md, 'RMA')."
        )
    if draining:
        return f"{draining} node(s) ended the week drained: return each once it validates."
    return "Every node ended the week in service or in planned maintenance: nothing to do."


def _sla(sla: dict[str, Any]) -> str:
    if sla.get("availability_met") is None:
        return "No availability figure this week: no node was exposed long enough to count."
    missed = [
        name
        for name, key in (("availability", "availability_met"), ("MTTR", "mttr_met"))
        if sla.get(key) is False
    ]
    if not missed:
        return "Both targets met: nothing to do."
    return (
        f"Missed {' and '.join(missed)}: the outages under 'Availability and jobs' and the "
        "drains below show where the downtime went; a node slow to return is waiting on repair."
    )


def _availability(a: dict[str, Any] | None) -> str:
    if a is None:
        return "Not computed for this week."
    hit = a["jobs"].get("interrupted_by_hardware") or 0
    if hit:
        return (
            f"{hit} job(s) were interrupted by hardware: check that notices reached them (next "
            "section) and that they resumed from a checkpoint."
        )
    return "No job was lost to hardware this week."


def _notices(n: dict[str, Any] | None) -> str:
    if n is None:
        return "Not computed for this week."
    if not n.get("jobs"):
        return "No job failed on a node it had been warned about: nothing to do."
    return (
        "Jobs below were warned before their node failed: a job that lost work anyway should "
        "checkpoint when told (docs/schedulers.md, StepReporter)."
    )


def _reliability(deltas: dict[str, Any]) -> str:
    mtbf = deltas.get("gpu_mtbf_h") or {}
    before, change = mtbf.get("previous"), mtbf.get("delta")
    now = None if before is None or change is None else before + change
    if now is not None and before is not None and now < 0.8 * before:
        return (
            f"GPU MTBF fell from {before:,.0f} h to {now:,.0f} h: the offenders below say "
            "whether one rack, SKU or driver carries the drop."
        )
    return "MTBF and MTTR within a fifth of last week's: nothing new to chase."


def _deltas(deltas: dict[str, Any]) -> str:
    worse = [
        key
        for key, d in deltas.items()
        if d.get("delta") is not None and key in ("gpu_failures", "node_outages") and d["delta"] > 0
    ]
    if worse:
        named = " and ".join(k.replace("_", " ") for k in worse)
        return (
            f"More {named} than last week: the interruptions and offenders below say where "
            "they came from."
        )
    return "No more failures or outages than last week."


def _goodput(g: dict[str, Any]) -> str:
    failures = g.get("lost_to_failures_gpu_h") or 0.0
    drains = g.get("lost_to_drains_gpu_h") or 0.0
    if not failures and not drains:
        return "No GPU-hour lost this week."
    if drains > failures:
        return (
            f"Drains cost more than failures ({drains:,.0f} against {failures:,.0f} GPU-h): "
            "return validated nodes sooner, or drain later (docs/acting.md)."
        )
    return (
        f"Failures cost {failures:,.0f} GPU-h, drains {drains:,.0f}: draining earlier, on the "
        "model's notices, is what would save them."
    )


def _drains(d: dict[str, Any]) -> str:
    if not d.get("performed"):
        return "No drain this week."
    unconfirmed = d.get("unconfirmed") or 0
    if unconfirmed:
        return (
            f"{unconfirmed} of {d['performed']} drains had no failure within 24 h: review the "
            "verdicts behind them (docs/judging.md) before raising the drain budget."
        )
    return "Every drain was confirmed by a failure or fatal event: the rules drained in time."


def _interruptions(i: dict[str, Any]) -> str:
    counts = {k: v for k, v in i.get("by_component", {}).items() if v}
    if not counts:
        return "No interruption this week."
    top = max(counts, key=lambda k: counts[k])
    return (
        f"Most interruptions came from {COMPONENT_NAMES.get(top, top)} ({counts[top]}): its "
        "runbook (docs/runbooks/) says when to reset, drain or send for RMA."
    )


def _calibration(c: dict[str, Any]) -> str:
    expected, actual = c.get("expected"), c.get("actual")
    if expected is None or actual is None or not c.get("gpus"):
        return "No model scored the fleet at the week's start: the rules alone decided."
    if actual > 2 * expected + 2:
        return (
            f"{actual} failures against {expected:.1f} expected: the model under-predicts; "
            "check its last refit under /v1/models before trusting its notices."
        )
    if expected > 2 * actual + 2:
        return f"{actual} failures against {expected:.1f} expected: the model over-predicts."
    return "Failures as many as the model expected: its probabilities can be used as they are."


def _offenders(o: dict[str, Any]) -> str:
    repeat = o.get("repeat") or []
    if repeat:
        return (
            f"{len(repeat)} node(s) failed again soon after a return: send them for repair "
            "rather than back to service (runbooks/repeat_offender.md)."
        )
    top = (o.get("node") or [None])[0]
    if top and top.get("count", 0) > 1:
        return f"{top['key']} leads with {top['count']} events: run fleetwatch validate on it."
    return "No node stands out."


def _survival(s: dict[str, Any]) -> str:
    at_90 = {
        sku: figures["survival_at_days"]["90"]
        for sku, figures in s.items()
        if isinstance(figures, dict) and figures.get("survival_at_days", {}).get("90") is not None
    }
    if not at_90:
        return "Too few lifetimes for a survival curve."
    worst = min(at_90, key=lambda sku: at_90[sku])
    return f"{worst} survives 90 days least often ({at_90[worst]:.0%}): stock its spares first."


def _stragglers(st: dict[str, Any]) -> str:
    worst = st.get("worst_nodes") or []
    if not worst:
        return "No straggler this week."
    return (
        f"{worst[0]['node']} was slow {worst[0]['count']} time(s): a node slow across jobs "
        "needs diagnostics (fleetwatch validate) before its next job."
    )
