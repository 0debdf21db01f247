#!/usr/bin/env bash
# Write deploy/kubernetes/fleetwatch.yaml, the chart rendered for kubectl users, from
# deploy/kubernetes/values.yaml (tests/deploy/test_chart.py checks it is up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(scripts/ensure-helm.sh)
args=(fleetwatch deploy/helm/fleetwatch --namespace fleetwatch -f deploy/kubernetes/values.yaml
  --kube-version 1.30.0)
{
  echo "# Rendered from the Helm chart by scripts/render-kubernetes-manifests.sh; do not edit:"
  echo "#   helm template ${args[*]}"
  echo "# For kubectl users: PostgreSQL, the api and worker, the agent on GPU nodes and k8s-sync."
  echo "# First: kubectl create namespace fleetwatch, and the Secret 'fleetwatch' with"
  echo "# database-url (deploy/kubernetes/values.yaml says how). Then: kubectl apply -f this file."
  echo "# The Job fleetwatch-migrate migrates the schema (the servers wait for it, restarting);"
  echo "# then create the tokens (fleetwatch token create, in the worker pod) and add agent-token,"
  echo "# read-token and scheduler-token to the Secret: the agents and k8s-sync start with them."
  "$helm" template "${args[@]}"
} >deploy/kubernetes/fleetwatch.yaml.tmp
mv deploy/kubernetes/fleetwatch.yaml.tmp deploy/kubernetes/fleetwatch.yaml
