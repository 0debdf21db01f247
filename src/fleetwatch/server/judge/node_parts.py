"""One node's judgement in parts, each isolated: what one part cannot judge, the others still do.

A node was judged as one item (:mod:`fleetwatch.server.runtime.isolation`): one machine check whose
``details`` the host rules could not read made the whole node fail every pass, so a later Xid 79
on it gave no verdict, no eviction and no alert (issue 35). Now each rule family is an item of its
own (the Xid rules, the host-error rules, the port rules, each GPU's telemetry rules, the missing
GPUs): a part that raises is logged and counted as before, the node's other parts still give
their verdicts, and the node's GPUs get one more verdict, ``unjudged_evidence`` (host, about the
node, warning, investigate), naming each part that failed and how, so that the alerts tell the
operator what went unjudged instead of only a counter moving.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager

from fleetwatch.server.concepts.verdict import Verdict
from fleetwatch.server.runtime.isolation import ItemGuard

__all__ = ["UNJUDGED", "Found", "NodeParts", "unjudged_verdict"]

UNJUDGED = "unjudged_evidence"
Found = dict[str, list[Verdict]]  # verdicts by GPU UUID


def unjudged_verdict(failed: Mapping[str, str]) -> Verdict:
    """The verdict naming the parts of a node's judgement that failed (part: error)."""
    names = ", ".join(failed)
    return Verdict(
        "host",
        rule=UNJUDGED,
        severity="warning",
        action="investigate",
        counts_against_gpu=False,
        source="FleetWatch assessment, each rule family isolated per node (judge/node_parts.py)",
        first_seen=None,
        last_seen=None,
        evidence={"scope": "node", "component": "host", "failed": dict(failed)},
        note=f"not judged on this node: {names} ({next(iter(failed.values()))}); the rest of "
        "its evidence is judged; the server log has the traceback",
    )


class NodeParts:
    """Runs the parts of one node's judgement through ``guard``, each its own item::

    parts = NodeParts(guard, "node id 7", uuids)
    with parts.part("Xid rules") as out:
        judge_the_xids(out)
    verdicts = parts.verdicts()
    """

    def __init__(self, guard: ItemGuard, node: str, gpus: Collection[str]) -> None:
        self.guard = guard
        self.node = node  # names the items in the log: "node id 7: host error rules"
        self.gpus = gpus  # the node's GPU UUIDs, which a failure's verdict is given to
        self.found: Found = defaultdict(list)
        self.failed: dict[str, str] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[Found]:
        """Run the block as the part ``name``: it adds its verdicts to the yielded mapping,
        which is kept only when the block completes; a failure is swallowed and noted."""
        found: Found = defaultdict(list)
        item = f"{self.node}: {name}"
        with self.guard.item(None, item) as ok:
            yield found
        if ok:
            for uuid, verdicts in found.items():
                self.found[uuid].extend(verdicts)
        else:
            self.failed[name] = self.guard.error_of(item) or "failed"

    def verdicts(self) -> Found:
        """What the parts found, and one :data:`UNJUDGED` verdict per GPU if any part failed."""
        if self.failed:
            verdict = unjudged_verdict(self.failed)
            for uuid in self.gpus:
                self.found[uuid].append(verdict)
        return self.found
