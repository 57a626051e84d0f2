#!/usr/bin/env bash
# Start PostgreSQL and Redis when they are not running, and create the test role
# and database. Safe to run repeatedly.
set -euo pipefail
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
psql_admin() { psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qtAc "$1"; }
if [ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname='adapterplane'")" != "1" ]; then
  psql_admin "CREATE ROLE adapterplane LOGIN PASSWORD 'adapterplane'"
fi
# adapterplane_test_gw0..3: one per pytest-xdist worker (tests/conftest.py)
for db in adapterplane adapterplane_test adapterplane_test_gw{0..3}; do
  if [ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname='$db'")" != "1" ]; then
    psql_admin "CREATE DATABASE $db OWNER adapterplane"
  fi
done
