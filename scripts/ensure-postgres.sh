#!/usr/bin/env bash
# Make sure a PostgreSQL answers for the tests: the one named by FLEETWATCH_TEST_DATABASE_URL,
# else the local one on 127.0.0.1:5432, started if it is installed but stopped.
set -euo pipefail

if [ -n "${FLEETWATCH_TEST_DATABASE_URL:-}" ]; then
  exit 0
fi
if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
  exit 0
fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  for version in $(ls /etc/postgresql); do
    echo "starting local PostgreSQL $version" >&2
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
  for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 && exit 0
    sleep 1
  done
fi
echo "ensure-postgres: no PostgreSQL at 127.0.0.1:5432 and none could be started;" \
     "set FLEETWATCH_TEST_DATABASE_URL=postgresql://user@host:port/db" >&2
exit 1
