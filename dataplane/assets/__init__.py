"""Deterministic demo and test assets: tiny Llama models, SmolLM2, real PEFT adapters.

Usage::

    from pathlib import Path
    from dataplane.assets import make_tiny_llama, make_peft_adapter, prepare_smollm2

    # HF dir: config.json + model.safetensors (fp32, random, deterministic per seed)
    base = make_tiny_llama(tmp / "base", seed=0)
    # PEFT dir: adapter_config.json + adapter_model.safetensors
    adapter = make_peft_adapter(
        base, tmp / "ad1", seed=1, rank=4, alpha=8,
        target_modules=["q_proj", "v_proj"],
    )
    # SmolLM2-135M-Instruct as fp32 safetensors + tokenizer (~20 s once, then cached)
    smol = prepare_smollm2(cache_dir / "smollm2")

Everything here uses torch/transformers/peft and is meant for the demo, tests and
benches. Production code paths (dataplane.identity, dataplane.artifacts) never import it.
Submodules are imported lazily so `import dataplane.assets` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataplane.assets.peft_adapters import make_peft_adapter
    from dataplane.assets.smollm2 import prepare_smollm2, smollm2_gguf_path
    from dataplane.assets.tiny_llama import TINY_LLAMA_DEFAULTS, make_tiny_llama

__all__ = [
    "TINY_LLAMA_DEFAULTS",
    "make_peft_adapter",
    "make_tiny_llama",
    "prepare_smollm2",
    "smollm2_gguf_path",
]

_LAZY = {
    "TINY_LLAMA_DEFAULTS": "dataplane.assets.tiny_llama",
    "make_tiny_llama": "dataplane.assets.tiny_llama",
    "make_peft_adapter": "dataplane.assets.peft_adapters",
    "prepare_smollm2": "dataplane.assets.smollm2",
    "smollm2_gguf_path": "dataplane.assets.smollm2",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dataplane.assets' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
