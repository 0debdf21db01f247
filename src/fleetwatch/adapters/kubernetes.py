"""Kubernetes through the official client: cordon and taint a node for an eviction.

What FleetWatch's hold on a node looks like::

    spec.unschedulable: true                                   (cordon)
    spec.taints: [..., {key: fleetwatch.io/unhealthy, value: <reason_kind>, effect: NoSchedule}]
    metadata.annotations: {fleetwatch.io/eviction-id: "42"}

The annotation is how FleetWatch knows the cordon is its own: an unschedulable node without it
was cordoned by someone else and is never touched. Every change is one JSON merge patch
(``application/merge-patch+json``, RFC 7386) carrying ``metadata.resourceVersion``, so a node
changed since it was read answers 409 instead of being overwritten; ``spec.taints`` is a list,
which a merge patch replaces whole, so the patch sends every other taint back unchanged.

Maintenance (``k8s-sync --maintenance``): a node annotated ``fleetwatch.io/maintenance`` is in
a FleetWatch maintenance window, keyed ``kubernetes:<node>``, for as long as the annotation is
there; its value is the window's reason::

    kubectl annotate node gpu-17 fleetwatch.io/maintenance="swap PSU, ticket OPS-123"
    kubectl annotate node gpu-17 fleetwatch.io/maintenance-            (ends it)
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, ClassVar, Protocol, cast

from fleetwatch.adapters.client import Eviction
from fleetwatch.adapters.maintenance import MaintenancePlan
from fleetwatch.adapters.sync import BackendError, Hold, HoldKind
from fleetwatch.errors import ConfigError

__all__ = [
    "EVICTION_ANNOTATION",
    "MAINTENANCE_ANNOTATION",
    "TAINT_KEY",
    "KubernetesBackend",
    "NodesApi",
    "core_api",
    "taint_value",
]

logger = logging.getLogger(__name__)

TAINT_KEY = "fleetwatch.io/unhealthy"
EVICTION_ANNOTATION = "fleetwatch.io/eviction-id"
MAINTENANCE_ANNOTATION = "fleetwatch.io/maintenance"
_MAX_WINDOW_REASON = 500  # what POST /v1/maintenance accepts
_MERGE_PATCH = "application/merge-patch+json"
_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def taint_value(text: str) -> str:
    """A valid label value: at most 63 of ``[A-Za-z0-9._-]``, starting and ending alphanumeric."""
    value = _NOT_LABEL_CHARS.sub("-", text).strip("._-")[:63].rstrip("._-")
    return value or "unhealthy"


class NodesApi(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` this adapter calls (raw JSON answers)."""

    def read_node(self, name: str, **kwargs: Any) -> Any: ...

    def list_node(self, **kwargs: Any) -> Any: ...

    def patch_node(self, name: str, body: Any, **kwargs: Any) -> Any: ...


def core_api(kubeconfig: str | None = None, in_cluster: bool = False) -> NodesApi:
    """A ``CoreV1Api`` from the service account (in-cluster) or a kubeconfig file."""
    from kubernetes import client, config

    # Some client versions ship no type hints: call the loaders untyped.
    load: Any = config.load_incluster_config if in_cluster else config.load_kube_config
    try:
        if in_cluster:
            load()
        else:
            load(config_file=kubeconfig)
    except config.ConfigException as exc:
        where = "in-cluster service account" if in_cluster else kubeconfig or "~/.kube/config"
        raise ConfigError(f"kubernetes config ({where}): {exc}") from exc
    return cast(NodesApi, client.CoreV1Api())


class KubernetesBackend:
    """``NodeBackend`` for Kubernetes: hold = cordon + our taint + our annotation."""

    name: ClassVar[str] = "kubernetes"

    def __init__(self, api: NodesApi) -> None:
        self._api = api

    def inspect(self, node: str) -> Hold:
        found = self._read(node)
        return _hold(found) if found is not None else Hold(HoldKind.MISSING)

    def snapshot(self) -> dict[str, Hold]:
        return {item["metadata"]["name"]: _hold(item) for item in self._list()}

    def maintenance(self) -> dict[str, MaintenancePlan]:
        """Each node annotated ``fleetwatch.io/maintenance`` as a plan keyed by its name."""
        plans = {}
        for item in self._list():
            annotations = item.get("metadata", {}).get("annotations") or {}
            if MAINTENANCE_ANNOTATION not in annotations:
                continue
            name = item["metadata"]["name"]
            text = " ".join(str(annotations[MAINTENANCE_ANNOTATION]).split()).replace("\x00", "")
            reason = text[:_MAX_WINDOW_REASON] or f"annotated {MAINTENANCE_ANNOTATION}"
            plans[f"kubernetes:{name}"] = MaintenancePlan((name,), reason)
        return plans

    def _list(self) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._api.list_node(_preload_content=False)
        except ApiException as exc:
            raise BackendError(f"listing nodes: {_api_error(exc)}") from exc
        items: list[dict[str, Any]] = json.loads(response.data).get("items", [])
        return items

    def hold(self, eviction: Eviction) -> None:
        node = self._read(eviction.node)
        if node is None:
            raise BackendError(f"node {eviction.node} is gone")
        if _hold(node).kind is HoldKind.OTHER:  # re-checked on the version the patch names
            raise BackendError(f"node {eviction.node} was cordoned by someone else meanwhile")
        taints = [t for t in _taints(node) if t.get("key") != TAINT_KEY]
        taints.append(
            {"key": TAINT_KEY, "value": taint_value(eviction.reason_kind), "effect": "NoSchedule"}
        )
        self._patch(
            node,
            {
                "metadata": {"annotations": {EVICTION_ANNOTATION: str(eviction.id)}},
                "spec": {"unschedulable": True, "taints": taints},
            },
        )

    def release(self, node_name: str) -> None:
        node = self._read(node_name)
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        if node is None or EVICTION_ANNOTATION not in annotations:
            raise BackendError(f"node {node_name} is no longer held by fleetwatch")
        taints = [t for t in _taints(node) if t.get("key") != TAINT_KEY]
        self._patch(
            node,
            {
                "metadata": {"annotations": {EVICTION_ANNOTATION: None}},
                "spec": {"unschedulable": None, "taints": taints or None},
            },
        )

    def _read(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._api.read_node(name, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BackendError(f"reading node {name}: {_api_error(exc)}") from exc
        node: dict[str, Any] = json.loads(response.data)
        return node

    def _patch(self, node: dict[str, Any], body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        name = node["metadata"]["name"]
        body["metadata"]["resourceVersion"] = node["metadata"].get("resourceVersion")
        try:
            self._api.patch_node(name, body, _content_type=_MERGE_PATCH)
        except ApiException as exc:
            raise BackendError(f"patching node {name}: {_api_error(exc)}") from exc


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("spec", {}).get("taints") or [])


def _hold(node: dict[str, Any]) -> Hold:
    annotations = node.get("metadata", {}).get("annotations") or {}
    ours = annotations.get(EVICTION_ANNOTATION)
    cordoned = bool(node.get("spec", {}).get("unschedulable"))
    if ours is not None:
        eviction_id = int(ours) if str(ours).isdigit() else None
        if cordoned:
            return Hold(HoldKind.OURS, f"eviction {ours}", eviction_id)
        # Uncordoned by an operator while our annotation (and maybe taint) remain: back.
        return Hold(HoldKind.FREE, "uncordoned outside fleetwatch", eviction_id)
    if cordoned:
        return Hold(HoldKind.OTHER, "cordoned by someone else (no fleetwatch annotation)")
    return Hold(HoldKind.FREE)


def _api_error(exc: Any) -> str:
    try:
        message = json.loads(exc.body).get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return f"HTTP {exc.status}: {message or exc.reason}"
