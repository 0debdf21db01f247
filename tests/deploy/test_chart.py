"""The Helm chart (deploy/helm/fleetwatch), through the real ``helm`` (lint and template) with
the default values and each values file of its ci/ folder (every option on among them).

Every rendered object is checked against Kubernetes' own OpenAPI documents and the Prometheus
Operator's and cert-manager's CRD schemas (tests/deploy/schemas.py), then for what a schema
cannot see: references between the objects (names, keys, ports, selectors), each container's
arguments parsed by FleetWatch's own CLI and its environment names against the settings
classes. tests/integration/test_chart_processes.py runs the rendered containers as processes.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tests.deploy.cli_check import is_setting, parse_args
from tests.deploy.helm import (
    CHART,
    REPO,
    SCENARIOS,
    helm,
    kubectl_render_args,
    render,
    render_objects,
)
from tests.deploy.schemas import load_schemas

SECRET_KEYS = {"database-url", "agent-token", "read-token", "scheduler-token", "secret-keys"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def objects_of(scenario: str) -> list[dict[str, Any]]:
    values, apis = SCENARIOS[scenario]
    return render_objects(values, apis)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, its pod template) for each Deployment, DaemonSet and Job."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield obj, obj["spec"]["template"]


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for workload, template in pod_specs(objects):
        for container in template["spec"]["containers"]:
            yield f"{workload['kind']}/{workload['metadata']['name']}", container


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        present = labels.get(expr["key"])
        if expr["operator"] == "In" and present not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and present in expr["values"]:
            return False
        if expr["operator"] == "Exists" and present is None:
            return False
    return True


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_passes(scenario: str) -> None:
    values, _ = SCENARIOS[scenario]
    command = [helm(), "lint", "--strict", str(CHART), "--namespace", "fleetwatch"]
    for path in values:
        command += ["-f", str(REPO / path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_matches_its_schemas(scenario: str) -> None:
    schemas = load_schemas()
    objects = objects_of(scenario)
    assert objects
    for obj in objects:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        assert schemas.sources_for(obj), f"{label}: no schema knows {obj['apiVersion']}"
        for source, problems in schemas.errors(obj).items():
            assert not problems, f"{label} against {source}: {problems}"


def test_the_schema_check_catches_a_misspelt_field() -> None:
    """The validation is strict: a field no schema names fails (as kubectl --validate=strict)."""
    schemas = load_schemas()
    deployment = one(objects_of("postgresql"), "Deployment", "-api")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicey"] = "Always"
    broken["spec"]["replicas"] = "2"
    problems = [p for found in schemas.errors(broken).values() for p in found]
    assert any("imagePullPolicey: unknown field" in p for p in problems)
    assert any(".spec.replicas: expected an integer" in p for p in problems)


def _break_network_policy(obj: dict[str, Any]) -> None:
    obj["spec"]["podSelectr"] = {}


def _break_pod_disruption_budget(obj: dict[str, Any]) -> None:
    obj["spec"]["minAvailable"] = True


def _break_cluster_role(obj: dict[str, Any]) -> None:
    obj["rules"][0]["verbs"] = "get"


def _break_cluster_role_binding(obj: dict[str, Any]) -> None:
    del obj["roleRef"]["name"]


@pytest.mark.parametrize(
    ("kind", "source", "breaks", "expected"),
    [
        ("NetworkPolicy", "v3", _break_network_policy, ".spec.podSelectr: unknown field"),
        ("NetworkPolicy", "v2", _break_network_policy, ".spec.podSelectr: unknown field"),
        ("PodDisruptionBudget", "v3", _break_pod_disruption_budget, ".spec.minAvailable: True"),
        ("PodDisruptionBudget", "v2", _break_pod_disruption_budget, ".spec.minAvailable: True"),
        ("ClusterRole", "v2", _break_cluster_role, ".rules[0].verbs: expected a list"),
        ("ClusterRoleBinding", "v2", _break_cluster_role_binding, "field 'name' is missing"),
    ],
)
def test_broken_policy_network_and_rbac_objects_fail_their_schemas(
    kind: str, source: str, breaks: Any, expected: str
) -> None:
    """PodDisruptionBudget and NetworkPolicy are checked against kubernetes/kubernetes'
    api/openapi-spec/v3 documents and the v2 one; ClusterRole and ClusterRoleBinding against
    the v2 one only (data/schemas/README.md says why)."""
    schemas = load_schemas()
    name = getattr(schemas, source).name
    rendered = by_kind(objects_of("all-on"), kind)[0]
    assert not schemas.errors(rendered)[name]
    broken = json.loads(json.dumps(rendered))
    breaks(broken)
    problems = schemas.errors(broken)[name]
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_refer_to_each_other_correctly(scenario: str) -> None:
    """What the API server's own validation or a running cluster would refuse, and no schema
    says: names, selectors over templates, named ports, Secret and ConfigMap keys, accounts."""
    objects = objects_of(scenario)
    values_files, _ = SCENARIOS[scenario]
    existing_secret = any(
        (yaml.safe_load((REPO / v).read_text()) or {}).get("secrets", {}).get("existingSecret")
        for v in values_files
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert len(names) == len(objects), "two objects of one kind share a name"
    secrets = {
        o["metadata"]["name"]: set(o.get("stringData", {})) | set(o.get("data", {}))
        for o in by_kind(objects, "Secret")
    }
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind(objects, "ConfigMap")}
    accounts = {o["metadata"]["name"] for o in by_kind(objects, "ServiceAccount")}
    for obj in objects:
        name = obj["metadata"]["name"]
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, name
        if obj["kind"] in ("Service", "Deployment", "DaemonSet"):
            assert DNS_LABEL.match(name) and len(name) <= 63, name
        for key, value in obj["metadata"].get("labels", {}).items():
            assert len(str(value)) <= 63 and re.match(
                r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", str(value)
            ), (key, value)

    def secret_ref(ref: dict[str, Any], where: str) -> None:
        if ref["name"] in secrets:
            assert ref["key"] in secrets[ref["name"]] or ref.get("optional"), (where, ref)
        else:
            assert existing_secret and ref["key"] in SECRET_KEYS, (where, ref)

    for workload, template in pod_specs(objects):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        selector = workload["spec"].get("selector")
        labels = template["metadata"].get("labels", {})
        if selector is not None:
            assert selects(selector, labels), where
        spec = template["spec"]
        account = spec.get("serviceAccountName")
        assert account is None or account in accounts, (where, account)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert len(volumes) == len(spec.get("volumes", [])), where
        for volume in volumes.values():
            if "configMap" in volume:
                data = config_maps[volume["configMap"]["name"]]
                for item in volume["configMap"].get("items", []):
                    assert item["key"] in data, (where, item)
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names, (where, claim)
        for container in spec["containers"]:
            ports = {
                p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p
            }
            assert all(len(p) <= 15 for p in ports), (where, ports)
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (where, mount)
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                action = container.get(probe, {})
                for handler in ("httpGet", "tcpSocket"):
                    port = action.get(handler, {}).get("port")
                    if isinstance(port, str):
                        assert port in ports, (where, probe, port)
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret_ref(ref, where)
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, where
    workloads = [(w, t["metadata"].get("labels", {})) for w, t in pod_specs(objects)]
    for service in by_kind(objects, "Service"):
        chosen = [
            w
            for w, labels in workloads
            if selects({"matchLabels": service["spec"]["selector"]}, labels)
        ]
        assert len(chosen) == 1, service["metadata"]["name"]
        ports = {
            p["name"]
            for c in chosen[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, port
    for budget in by_kind(objects, "PodDisruptionBudget"):
        assert any(selects(budget["spec"]["selector"], labels) for _, labels in workloads)
    for binding in by_kind(objects, "ClusterRoleBinding"):
        assert ("ClusterRole", binding["roleRef"]["name"]) in names
        for subject in binding["subjects"]:
            assert subject["name"] in accounts and subject["namespace"] == "fleetwatch"
    for monitor in by_kind(objects, "ServiceMonitor"):
        services = [
            s
            for s in by_kind(objects, "Service")
            if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
        ]
        assert len(services) == 1
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
            secret_ref(endpoint["authorization"]["credentials"], "ServiceMonitor")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_container_arguments_and_environment_are_fleetwatchs(scenario: str) -> None:
    """Each container's arguments parse with FleetWatch's own CLI (the image's entrypoint is
    `fleetwatch`), and each FLEETWATCH_* name it gets is a setting: a typo in either would pass
    every schema. The ConfigMap's keys are server settings too."""
    objects = objects_of(scenario)
    tls = any("FLEETWATCH_SERVER_TLS_CERT" in json.dumps(o) for o in objects)

    def check_name(name: str, where: str) -> None:
        if name.startswith("FLEETWATCH_"):
            assert is_setting(name), (where, name)

    for where, container in containers(objects):
        assert "command" not in container, f"{where}: the image's entrypoint runs `fleetwatch`"
        parse_args(container["args"])
        for env in container.get("env", []):
            check_name(env["name"], where)
    for config_map in by_kind(objects, "ConfigMap"):
        for key in config_map.get("data", {}):
            if key.startswith("FLEETWATCH_"):
                check_name(key, config_map["metadata"]["name"])
    assert tls == (scenario in {"all-on", "1000-nodes"}), scenario


def test_a_misspelt_flag_fails_the_argument_check() -> None:
    with pytest.raises(click.NoSuchOption):
        parse_args(["server", "--role=api", "--prot=8400"])


def test_default_values_run_one_sqlite_pod() -> None:
    objects = objects_of("default")
    deployments = by_kind(objects, "Deployment")
    assert [d["metadata"]["name"] for d in deployments] == ["fleetwatch"]
    (single,) = deployments
    assert single["spec"]["replicas"] == 1 and single["spec"]["strategy"]["type"] == "Recreate"
    args = single["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--role=all" in args
    assert not by_kind(objects, "Job"), "SQLite migrates itself in its one process"
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "ServiceMonitor", "PrometheusRule", "ClusterRole"}.isdisjoint(kinds)


def test_postgresql_splits_api_and_worker_with_a_migration_hook() -> None:
    objects = objects_of("postgresql")
    api = one(objects, "Deployment", "-api")
    worker = one(objects, "Deployment", "-worker")
    assert "--role=api" in api["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--role=worker" in worker["spec"]["template"]["spec"]["containers"][0]["args"]
    # api: spread over hosts; worker: two, never on one host (one leads, one stands by).
    (spread,) = api["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert worker["spec"]["replicas"] == 2
    (anti,) = worker["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert selects(anti["labelSelector"], worker["spec"]["template"]["metadata"]["labels"])
    job = one(objects, "Job", "-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["db", "upgrade"]
    # Hooks run before the release's Secret exists: the Job's Secret is a hook of its own, first.
    hook_secret = one(objects, "Secret", "-migrate")
    assert int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    budgets = {b["metadata"]["name"]: b["spec"] for b in by_kind(objects, "PodDisruptionBudget")}
    assert budgets == {
        "fleetwatch-api": {"minAvailable": 1, "selector": api["spec"]["selector"]},
        "fleetwatch-worker": {"minAvailable": 1, "selector": worker["spec"]["selector"]},
    }


def test_monitoring_objects_only_where_the_operator_is() -> None:
    without = {o["kind"] for o in objects_of("postgresql")}
    assert {"ServiceMonitor", "PrometheusRule"}.isdisjoint(without)
    values, apis = SCENARIOS["all-on"]
    objects = render_objects(values, apis)
    rule = one(objects, "PrometheusRule")
    shipped = yaml.safe_load(
        (REPO / "dashboards/prometheus/rules/fleetwatch.rules.yml").read_text()
    )
    assert rule["spec"] == shipped
    monitor = one(objects, "ServiceMonitor")
    jobs = [e["relabelings"][0]["replacement"] for e in monitor["spec"]["endpoints"]]
    assert jobs == ["fleetwatch"] + ["fleetwatch-shards"] * 32  # the job names the rules read
    shards = [e["params"] for e in monitor["spec"]["endpoints"][1:]]
    assert shards == [{"shard": [str(n)], "shards": ["32"]} for n in range(32)]
    dashboards = {
        c["metadata"]["name"]: c
        for c in by_kind(objects, "ConfigMap")
        if "dashboard" in c["metadata"]["name"]
    }
    files = sorted((REPO / "dashboards/grafana/dashboards").glob("*.json"))
    assert len(dashboards) == len(files)
    for path in files:
        config_map = dashboards[f"fleetwatch-dashboard-{path.stem}"]
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())


def test_chart_files_are_the_shipped_rules_and_dashboards() -> None:
    """The chart can read only its own folder: its copies must be the shipped files."""
    assert (CHART / "files/fleetwatch.rules.yml").read_bytes() == (
        REPO / "dashboards/prometheus/rules/fleetwatch.rules.yml"
    ).read_bytes(), (
        "cp dashboards/prometheus/rules/fleetwatch.rules.yml deploy/helm/fleetwatch/files/"
    )
    shipped = {
        p.name: p.read_bytes() for p in (REPO / "dashboards/grafana/dashboards").glob("*.json")
    }
    copied = {p.name: p.read_bytes() for p in (CHART / "files/dashboards").glob("*.json")}
    assert copied == shipped, (
        "cp dashboards/grafana/dashboards/*.json deploy/helm/fleetwatch/files/dashboards/"
    )


def test_k8s_sync_may_do_exactly_what_it_does() -> None:
    """nodes get/list/patch; pods list/patch only with annotatePods; nothing else, anywhere."""
    plain = one(objects_of("sqlite-kmsg"), "ClusterRole")
    assert plain["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
    ]
    annotating = one(objects_of("all-on"), "ClusterRole")
    assert annotating["rules"] == plain["rules"] + [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}
    ]
    for scenario in SCENARIOS:
        kinds = {o["kind"] for o in objects_of(scenario)}
        assert {"Role", "RoleBinding"}.isdisjoint(kinds)
        assert len(by_kind(objects_of(scenario), "ClusterRole")) <= 1


@pytest.mark.parametrize("scenario", ["all-on", "sqlite-kmsg", "kubectl"])
def test_the_agent_runs_on_gpu_nodes_unprivileged(scenario: str) -> None:
    agent = one(objects_of(scenario), "DaemonSet", "-agent")
    spec = agent["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerated = {t["key"] for t in spec["tolerations"]}
    assert {"nvidia.com/gpu", "fleetwatch.io/unhealthy"} <= tolerated  # stays on evicted nodes
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    kmsg = "--kernel-log=kmsg" in container["args"]
    assert security["capabilities"].get("add", []) == (["SYSLOG"] if kmsg else [])
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert ("/dev/kmsg" in paths) == kmsg
    if scenario != "sqlite-kmsg":
        assert spec["runtimeClassName"] == "nvidia"
    names = {e["name"]: e for e in container["env"]}
    assert (
        names["FLEETWATCH_AGENT_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    )


def test_resource_requests_cover_the_measured_figures() -> None:
    """BENCHMARKS.md's 100,000-GPU run: the server's peak RSS (worker, api) and the agent's."""
    text = (REPO / "BENCHMARKS.md").read_text()
    peak = re.search(
        r"\| server peak RSS \| < 2 GiB \| [\d.]+ GiB \(worker ([\d.]+), api ([\d.]+)\)", text
    )
    agent_peak = re.search(r"\| agent peak RSS \| <= 80 MB \| (\d+) MB", text)
    assert peak and agent_peak, "BENCHMARKS.md's rows changed: update this test and values.yaml"
    worker_gib, api_gib = float(peak.group(1)), float(peak.group(2))
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def mib(quantity: str) -> float:
        number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
        return int(number) * (1024 if unit == "Gi" else 1)

    server = values["server"]
    assert mib(server["worker"]["resources"]["requests"]["memory"]) >= worker_gib * 1024
    assert mib(server["api"]["resources"]["requests"]["memory"]) >= api_gib * 1024
    assert mib(server["single"]["resources"]["requests"]["memory"]) >= worker_gib * 1024
    assert mib(values["agent"]["resources"]["requests"]["memory"]) * 1.048576 >= int(
        agent_peak.group(1)
    )
    for part in (
        server["api"],
        server["worker"],
        server["single"],
        values["agent"],
        values["k8sSync"],
    ):
        resources = part["resources"]
        assert mib(resources["limits"]["memory"]) >= mib(resources["requests"]["memory"])


def test_missing_values_fail_with_what_to_set(tmp_path: Path) -> None:
    cases = {
        "database:\n  type: postgresql\n": "needs database.url",
        "agent:\n  enabled: true\n": "agent.enabled needs secrets.agentToken",
        "k8sSync:\n  enabled: true\n": "k8sSync.enabled needs secrets.schedulerToken",
        "database:\n  type: mysql\n": "database.type must be sqlite or postgresql",
        "settings:\n  FLEETWATCH_SERVER_PORT: 1\n": "without the FLEETWATCH_SERVER_ prefix",
    }
    for text, message in cases.items():
        values = tmp_path / "values.yaml"
        values.write_text(text)
        done = subprocess.run(
            [helm(), "template", "fleetwatch", str(CHART), "-f", str(values)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode != 0 and message in done.stderr, (text, done.stderr)


def test_kubectl_manifests_are_the_chart_rendered() -> None:
    """deploy/kubernetes/ for kubectl users is what the chart renders from its values.yaml
    (scripts/render-kubernetes-manifests.sh writes it)."""
    expected = (REPO / "deploy/kubernetes/fleetwatch.yaml").read_text()
    header, _, body = expected.partition("\n---\n")
    assert header.startswith("# Rendered from the Helm chart"), header
    assert "---\n" + body == render(("deploy/kubernetes/values.yaml",)), (
        "deploy/kubernetes/fleetwatch.yaml is stale: run scripts/render-kubernetes-manifests.sh"
    )
    assert " ".join(kubectl_render_args()) in header
