#!/usr/bin/env bash
# Make sure the Slurm integration test can run a real slurmctld: the Debian packages slurmctld,
# slurm-client and munge are installed (apt-get, non-interactive, quiet), a munge key exists and
# munged answers. The test itself writes its own slurm.conf and starts slurmctld.
set -euo pipefail

missing=()
command -v slurmctld >/dev/null || missing+=(slurmctld)
command -v scontrol >/dev/null || missing+=(slurm-client)
command -v munged >/dev/null || missing+=(munge)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-slurm: missing ${missing[*]} and cannot apt-get install them (need root on Debian)" >&2
    exit 1
  fi
  echo "ensure-slurm: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Daemons must not be started by the packages' maintainer scripts: the test starts its own.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
  fi
  apt-get -qq update >/dev/null || true
  apt-get -qq -y -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    install --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$created_policy" -eq 1 ]; then rm -f "$policy"; fi
fi

key=/etc/munge/munge.key
if [ ! -s "$key" ]; then
  echo "ensure-slurm: creating $key" >&2
  install -d -m 0700 -o munge -g munge /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of="$key" status=none
  chown munge:munge "$key"
  chmod 0400 "$key"
fi

if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  install -d -m 0755 -o munge -g munge /run/munge
  install -d -m 0700 -o munge -g munge /var/log/munge /var/lib/munge
  echo "ensure-slurm: starting munged" >&2
  runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
  for _ in $(seq 1 20); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.5
  done
fi
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "ensure-slurm: munged is not answering; see /var/log/munge/munged.log" >&2
  exit 1
fi
echo "ensure-slurm: slurmctld $(slurmctld -V 2>/dev/null | awk '{print $2}'), munge ok" >&2
