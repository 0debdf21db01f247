r"""Checkpoint-interval advice from the fleet's current failure hazard (Young/Daly).

Failure rate of a job: the sum over its GPUs of each GPU's current hazard. From the assessment's
P(fail within H) at H = 1 day, a GPU's rate is :math:`\lambda = -\ln(1 - p) / H` (the constant
hazard that gives the same one-day probability). A GPU that a rule takes out of service (its
probability is 1 with basis ``rule``) is about to be drained or to fail, which interrupts the job
either way: it counts as :math:`p = 0.99` a day, :math:`\lambda \approx 4.6` per day, i.e. about
one interruption every 5 hours, and the answer lists it so that the job can avoid the node.
GPUs without a probability (no fitted model, no rule) add nothing and are counted apart.

With :math:`M = 1 / \sum \lambda` (mean time between failures of the job) and checkpoint cost
:math:`\delta`:

* Young (1974): :math:`\tau_Y = \sqrt{2 \delta M}`;
* Daly (2006), first order: :math:`\tau = \sqrt{2 \delta M} - \delta` for :math:`\delta < 2M`,
  and :math:`\tau = M` when :math:`\delta \ge 2M` (checkpointing costs more than it can save).

Goodput (fraction of wall time spent on work that is kept), first-order model: each segment of
:math:`\tau + \delta` seconds does :math:`\tau` of work, and a failure (rate :math:`1/M`) loses on
average half a segment plus the restart cost :math:`R`:

.. math:: G(\tau) = \frac{\tau}{\tau + \delta}\left(1 - \frac{(\tau + \delta)/2 + R}{M}\right)

clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "RULE_DAY_PROBABILITY",
    "CheckpointAdvice",
    "GpuHazard",
    "NodeHazard",
    "advise",
    "daly_interval",
    "goodput",
    "hazard_per_day",
    "young_interval",
]

DAY_S = 86400.0
RULE_DAY_PROBABILITY = 0.99


@dataclass(frozen=True)
class GpuHazard:
    node: str
    uuid: str
    probability: float | None  # P(fail within 1 day)
    out_of_service: bool = False


@dataclass
class NodeHazard:
    node: str
    gpus: int = 0
    rate_per_day: float = 0.0
    out_of_service_gpus: list[str] = field(default_factory=list)
    gpus_without_rate: int = 0


@dataclass(frozen=True)
class CheckpointAdvice:
    rate_per_day: float
    mtbf_s: float
    interval_s: float
    young_interval_s: float
    method: str  # "daly" | "daly_large_cost"
    goodput: float
    nodes: list[NodeHazard]


def hazard_per_day(probability: float, horizon_days: float = 1.0) -> float:
    """:math:`-\\ln(1 - p) / H`, for ``p`` in [0, 1) (``p`` = 1 is infinite)."""
    return -math.log1p(-probability) / horizon_days


def young_interval(delta_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> tuple[float, str]:
    """Daly's first-order optimum and which branch gave it."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s, "daly_large_cost"
    return math.sqrt(2.0 * delta_s * mtbf_s) - delta_s, "daly"


def goodput(interval_s: float, delta_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    segment = interval_s + delta_s
    value = interval_s / segment * (1.0 - (segment / 2.0 + restart_s) / mtbf_s)
    return min(max(value, 0.0), 1.0)


def advise(
    hazards: Iterable[GpuHazard], *, checkpoint_cost_s: float, restart_cost_s: float = 0.0
) -> CheckpointAdvice | None:
    """The advice, or ``None`` when no GPU has a rate (no model and no rule)."""
    per_node: dict[str, NodeHazard] = {}
    known = 0
    for h in hazards:
        node = per_node.setdefault(h.node, NodeHazard(h.node))
        node.gpus += 1
        if h.out_of_service:
            node.out_of_service_gpus.append(h.uuid)
            node.rate_per_day += hazard_per_day(RULE_DAY_PROBABILITY)
        elif h.probability is None:
            node.gpus_without_rate += 1
            continue
        else:
            node.rate_per_day += hazard_per_day(min(h.probability, RULE_DAY_PROBABILITY))
        known += 1
    total = sum(n.rate_per_day for n in per_node.values())
    if known == 0:
        return None
    mtbf_s = DAY_S / total if total > 0 else math.inf
    if math.isinf(mtbf_s):
        interval, method = math.inf, "daly"
        young = math.inf
        value = 1.0
    else:
        interval, method = daly_interval(checkpoint_cost_s, mtbf_s)
        young = young_interval(checkpoint_cost_s, mtbf_s)
        value = goodput(interval, checkpoint_cost_s, mtbf_s, restart_cost_s)
    nodes = sorted(per_node.values(), key=lambda n: (-n.rate_per_day, n.node))
    return CheckpointAdvice(total, mtbf_s, interval, young, method, value, nodes)
