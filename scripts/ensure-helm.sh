#!/usr/bin/env bash
# Print the path of the helm the chart tests use (tests/deploy/), building it once per machine
# into ~/.cache/fleetwatch/helm-<version>/helm.
#
# helm is not a Debian package; it is a Go module. Where the Go module proxy is reachable,
# `go install helm.sh/helm/v3/cmd/helm@<version>` builds it with Debian's golang-go (Go 1.19 on
# Debian 12, which is why the version is v3.11.3: later ones need a newer Go; `apt-get install
# golang-go` first). The flags are
# those of helm's own Makefile, so `helm version` and the Kubernetes version helm template
# assumes (1.26, client-go v0.26) are those of a release build.
#
# Where no proxy is reachable, nothing here can build it: put a helm of that version at the
# path above (or name one in FLEETWATCH_HELM) and this script takes it. The tests that need
# helm say so when it is missing (a failure with FLEETWATCH_REQUIRE_HELM=1, else a skip).
set -euo pipefail

version=${HELM_VERSION:-v3.11.3}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/fleetwatch/helm-$version
bin=$cache/helm

is_version() {
  [ -x "$1" ] && [ "$("$1" version --template '{{.Version}}' 2>/dev/null)" = "$version" ]
}

if [ -n "${FLEETWATCH_HELM:-}" ] && is_version "$FLEETWATCH_HELM"; then
  echo "$FLEETWATCH_HELM"
  exit 0
fi
if is_version "$bin"; then
  echo "$bin"
  exit 0
fi

# Debian's Go, where it can be installed (as root on Debian; ensure-debs.sh says why not otherwise).
command -v go >/dev/null || "$(dirname "$0")/ensure-debs.sh" golang-go >&2 || true
if command -v go >/dev/null; then
  pkg=helm.sh/helm/v3
  ldflags="-w -s -X $pkg/internal/version.version=$version -X $pkg/internal/version.metadata="
  ldflags+=" -X $pkg/internal/version.gitTreeState=clean"
  for where in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X $pkg/$where.k8sVersionMajor=1 -X $pkg/$where.k8sVersionMinor=26"
  done
  mkdir -p "$cache"
  echo "ensure-helm: building helm $version with $(go version | cut -d' ' -f3) (once)" >&2
  if GOBIN=$cache CGO_ENABLED=0 \
    go install -trimpath -ldflags "$ldflags" "$pkg/cmd/helm@$version" >&2 && is_version "$bin"; then
    echo "$bin"
    exit 0
  fi
fi
echo "ensure-helm: no helm $version at $bin, and it could not be built here" \
  "(go install needs Go >= 1.17 and the Go module proxy)" >&2
exit 1
