"""A random tiny Llama checkpoint in Hugging Face layout, deterministic for a seed.

`make_tiny_llama(dest, seed=0)` writes `config.json` and `model.safetensors` (fp32) into
`dest`. The weights are drawn from a `torch.Generator` seeded with `seed` in the fixed
order of `named_parameters()`, so the same seed and config give the same tensor bytes
regardless of transformers' own initialisation scheme. Norm weights are ones plus a small
perturbation so that they are not trivially the identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
"""Config fields of the default tiny model (head_dim 16, GQA group 2)."""

INIT_STD = 0.02
"""Standard deviation of the random projection/embedding weights."""


def make_tiny_llama(dest: Path, *, seed: int, **config_overrides: Any) -> Path:
    """Write a random tiny LlamaForCausalLM to `dest` and return `dest`.

    `config_overrides` replace entries of `TINY_LLAMA_DEFAULTS` (any LlamaConfig field).
    Output: `dest/config.json` and `dest/model.safetensors`, fp32. Deterministic for a
    given (seed, overrides). Overwrites files already in `dest`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {**TINY_LLAMA_DEFAULTS, **config_overrides}
    config = LlamaConfig(**fields)
    config.dtype = torch.float32
    torch_model: Any = LlamaForCausalLM(config)
    torch_model = torch_model.to(torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(INIT_STD * noise)
    torch_model.eval()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    torch_model.save_pretrained(dest)
    return dest
