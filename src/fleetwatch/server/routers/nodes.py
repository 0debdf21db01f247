"""Nodes: liveness (maintenance windows included), labels, GPU counts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fleetwatch.errors import InvalidInput
from fleetwatch.server.deps import DatabaseDep, LivenessDep, ReadAuth
from fleetwatch.server.repo.nodes import get_node, list_nodes, node_id_of
from fleetwatch.server.repo.ports import list_ports
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import INT32_MAX, Text
from fleetwatch.server.schemas.fleet import NodeDetail, NodePublic, NodesPublic, NodeState
from fleetwatch.server.schemas.ports import NodePortsPublic, PortPublic

__all__ = ["router"]

router = APIRouter(prefix="/nodes", tags=["nodes"])


def _parse_labels(raw: list[str]) -> dict[str, str]:
    labels = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(
                f"label filter {item!r} must look like key=value",
                [{"loc": ["query", "label"], "msg": "expected key=value"}],
            )
        labels[key] = value
    return labels


@router.get("", response_model=NodesPublic, summary="List nodes with liveness and GPU counts")
def read_nodes(
    db: DatabaseDep,
    liveness: LivenessDep,
    _token: ReadAuth,
    state: NodeState | None = None,
    label: Annotated[list[Text], Query(description="Filter by label, e.g. rack=r12")] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> NodesPublic:
    """Nodes sorted by name; a node is unreachable after 3 silent intervals while the server
    was up (unheard in the grace after a server start or a maintenance window's end), and
    ``maintenance`` while a maintenance window covers it (``maintenance`` names the window)."""
    with db.read() as conn:
        found = list_nodes(
            conn,
            now=liveness.clock(),
            liveness=liveness,
            state=state,
            labels=_parse_labels(label),
            limit=limit,
            offset=offset,
        )
    return NodesPublic(data=[NodePublic.model_validate(n) for n in found], count=len(found))


@router.get(
    "/{name}",
    response_model=NodeDetail,
    responses=error_responses(404),
    summary="One node and its GPUs",
)
def read_node(name: Text, db: DatabaseDep, liveness: LivenessDep, _token: ReadAuth) -> NodeDetail:
    """The node's state, labels and boot id, with each GPU's identity and latest sample."""
    with db.read() as conn:
        found = get_node(conn, name=name, now=liveness.clock(), liveness=liveness)
    return NodeDetail.model_validate(found)


@router.get(
    "/{name}/ports",
    response_model=NodePortsPublic,
    responses=error_responses(404),
    summary="One node's network adapter ports",
)
def read_node_ports(name: Text, db: DatabaseDep, _token: ReadAuth) -> NodePortsPublic:
    """Each InfiniBand or RoCE port of the node as last read (the agent's ``infiniband``
    collector), with the per-second rates of its counters since the reading before; empty for
    a node that sends no ports."""
    with db.read() as conn:
        ports = list_ports(conn, node_id=node_id_of(conn, name=name))
    return NodePortsPublic(
        node=name, data=[PortPublic.model_validate(p) for p in ports], count=len(ports)
    )
