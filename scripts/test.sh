#!/usr/bin/env bash
# The test command: install, start services, migrate, run the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/identity -x`).
# ADAPTERPLANE_TEST_WORKERS=N runs the suite on N pytest-xdist workers (default 2; 0: in
# this process), one test file per worker at a time (`--dist loadfile`: a module's agents
# and servers are started once); each worker has its own databases.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/services.sh
export ADAPTERPLANE_TEST_DATABASE_URL=${ADAPTERPLANE_TEST_DATABASE_URL:-postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane_test}
export ADAPTERPLANE_TEST_REDIS_URL=${ADAPTERPLANE_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
export TRITON_INTERPRET=1
ADAPTERPLANE_DATABASE_URL="$ADAPTERPLANE_TEST_DATABASE_URL" .venv/bin/adapterplane migrate
# moto's S3 server is started by the test session itself (tests/conftest.py) on a free port.
.venv/bin/ruff check .
.venv/bin/mypy controlplane agent dataplane cli
.venv/bin/lint-imports
.venv/bin/python -m cli.config_docs --check
workers=${ADAPTERPLANE_TEST_WORKERS:-2}
if [ "$workers" -gt 0 ]; then
  exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest "$@"
