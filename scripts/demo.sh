#!/usr/bin/env bash
# The README's first command: install, then run the end-to-end demo on the embedded
# stack (SQLite, file:// storage, SQLite-backed Celery worker) in ./var/demo.
# Extra arguments go to `adapterplane demo` (e.g. --data-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/adapterplane demo "$@"
