#!/usr/bin/env bash
# Install the Debian packages named on the command line if any is missing: the real parts the
# test suite runs (prometheus for promtool, prometheus-alertmanager, chromium, poppler-utils...).
# Non-interactive and quiet; daemons are not started by the packages (tests start their own);
# waits for the dpkg lock rather than failing when another install is running.
set -euo pipefail

missing=()
for package in "$@"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "ensure-debs: missing ${missing[*]} and cannot apt-get install them (need root on Debian)" >&2
  exit 1
fi
echo "ensure-debs: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  created_policy=1
fi
trap '[ "$created_policy" -eq 1 ] && rm -f "$policy"' EXIT
lock=(-o DPkg::Lock::Timeout=900)
apt-get "${lock[@]}" -qq update >/dev/null || true
apt-get "${lock[@]}" -qq -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
  install --no-install-recommends "${missing[@]}" >/dev/null
