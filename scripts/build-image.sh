#!/usr/bin/env bash
# Build the FleetWatch container image from the repository's Dockerfile where no container
# registry can be reached (Debian's package mirrors and PyPI can), with podman.
#
#   scripts/build-image.sh [--archive PATH [--format oci-archive|docker-archive]] [--refresh-base]
#   scripts/build-image.sh --print-base    # the suite, packages and base image it would use
#
# The Dockerfile starts from debian:<suite>-slim. This script makes that base itself: mmdebstrap
# installs the Dockerfile's DEBIAN_PACKAGES into a minbase <suite> root filesystem, which is
# imported as localhost/fleetwatch-base:<key> and given to the Dockerfile as BASE; everything
# after the base is the Dockerfile's own steps. The suite and the packages are read from the
# Dockerfile, so the two cannot drift apart.
#
# Costs: the root filesystem (a few minutes) is cached in ~/.cache/fleetwatch/image/ under a key
# hashed from its inputs (suite, packages, mmdebstrap options, architecture) and built once per
# machine; --refresh-base builds it again (Debian's security updates). The Python dependencies'
# layer is podman's layer cache, rebuilt when pyproject.toml changes; the fleetwatch wheel's
# layers are rebuilt when the source changes (seconds).
#
# Prints the image ID on stdout (all else goes to stderr) and tags it localhost/fleetwatch:<version>
# and localhost/fleetwatch:latest. --archive also writes the image to PATH (an OCI archive by
# default, which `podman load` and `docker load` read). Needs root, podman and mmdebstrap
# (scripts/ensure-debs.sh podman runc mmdebstrap).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
archive="" format=oci-archive refresh=0 print_base=0
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) archive=$2; shift 2 ;;
    --format) format=$2; shift 2 ;;
    --refresh-base) refresh=1; shift ;;
    --print-base) print_base=1; shift ;;
    *) echo "usage: $0 [--archive PATH [--format oci-archive|docker-archive]] [--refresh-base]" \
         "| --print-base" >&2
       exit 2 ;;
  esac
done
case "$format" in
  oci-archive|docker-archive) ;;
  *) echo "build-image: --format is oci-archive or docker-archive, not $format" >&2; exit 2 ;;
esac

dockerfile=$repo/Dockerfile
base=$(sed -n 's/^ARG BASE=//p' "$dockerfile")
packages=$(sed -n 's/^ARG DEBIAN_PACKAGES="\(.*\)"$/\1/p' "$dockerfile")
suite=$(printf '%s\n' "$base" | sed -n 's#^\(docker\.io/\)\{0,1\}\(library/\)\{0,1\}debian:\([a-z]*\)-slim$#\3#p')
if [ -z "$suite" ] || [ -z "$packages" ]; then
  echo "build-image: the Dockerfile must say ARG BASE=debian:<suite>-slim and" \
       "ARG DEBIAN_PACKAGES=\"...\" (found BASE=$base, DEBIAN_PACKAGES=$packages)" >&2
  exit 1
fi
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/src/fleetwatch/__init__.py")

# What debian:<suite>-slim is: the minbase variant (Priority: required, and apt) with /usr merged
# by symlinks as debootstrap does (not by the usrmerge package, which brings perl), without
# manuals, documentation (copyright files kept) or translations.
mmdebstrap_options=(
  --variant=minbase
  --format=tar
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --include="${packages// /,}"
  --skip=output/dev
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/groff/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
)
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
key=$(printf '%s\n' "$suite" "$arch" "${mmdebstrap_options[@]}" | sha256sum | cut -c1-16)
cache=${FLEETWATCH_CACHE_DIR:-$HOME/.cache/fleetwatch}/image
rootfs=$cache/debian-$suite-$key.tar
base_image=localhost/fleetwatch-base:$suite-$key
if [ "$print_base" = 1 ]; then
  printf 'suite=%s\npackages=%s\nimage=%s\n' "$suite" "$packages" "$base_image"
  exit 0
fi
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "build-image: $tool not found: scripts/ensure-debs.sh podman runc mmdebstrap" >&2; exit 1; }
done
mkdir -p "$cache"

# One build at a time on this machine (parallel test workers, a `make image` beside them).
exec 9>"$cache/build.lock"
flock 9

if [ "$refresh" = 1 ] || [ ! -s "$rootfs" ]; then
  echo "build-image: making the $suite base with mmdebstrap ($packages) into $rootfs" >&2
  mmdebstrap --quiet "${mmdebstrap_options[@]}" "$suite" "$rootfs.part" >&2
  mv "$rootfs.part" "$rootfs"
  podman image rm --force "$base_image" >/dev/null 2>&1 || true
fi
if ! podman image exists "$base_image"; then
  echo "build-image: importing $rootfs as $base_image" >&2
  # The configuration debian:<suite>-slim has.
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$rootfs" "$base_image" >/dev/null
fi

iidfile=$(mktemp)
trap 'rm -f "$iidfile"' EXIT
# --network host: the build's pip reaches PyPI as the host does (no bridge or iptables needed).
# runc, not crun: crun 1.8 refuses cgroup v1 hosts whose cgroup2 hierarchy holds a controller
# ("cgroups in hybrid mode not supported"). Limits no higher than this process's own: podman
# asks for 1,048,576 open files, which needs CAP_SYS_RESOURCE where the hard limit is lower.
nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ] && nofile=1048576
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
# The host's CA bundle over the image's while the build runs (not kept in the image): where a
# proxy re-signs TLS, the host trusts its certificate authority and Debian's bundle does not.
trust=()
[ -s /etc/ssl/certs/ca-certificates.crt ] \
  && trust=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
build=(podman build --layers --pull=never --network host --format docker --runtime runc
       --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" "${trust[@]}"
       --build-arg "BASE=$base_image" --file "$dockerfile")
# The wheel stage tagged too, so that the pruning below keeps its layers for the next build.
"${build[@]}" --target wheel --tag localhost/fleetwatch-build:wheel "$repo" >&2
"${build[@]}" --iidfile "$iidfile" \
  --tag "localhost/fleetwatch:$version" --tag localhost/fleetwatch:latest "$repo" >&2
image=$(cat "$iidfile")
# Earlier builds' untagged images (each change of pyproject.toml left a 600 MB layer behind);
# only this Dockerfile's, by its label.
podman image prune --force --filter label=org.opencontainers.image.title=FleetWatch >/dev/null

if [ -n "$archive" ]; then
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive.part"
  podman save --quiet --format "$format" --output "$archive.part" "localhost/fleetwatch:$version"
  mv "$archive.part" "$archive"
  echo "build-image: wrote $archive ($format, $(du -h "$archive" | cut -f1))" >&2
fi
echo "$image"
