"""Real PEFT LoRA adapters for a local base model, deterministic for a seed.

`make_peft_adapter(base_dir, dest, seed=..., rank=..., alpha=..., target_modules=[...])`
builds the adapter with `peft.get_peft_model` (so the config and key names are exactly
what PEFT writes) and saves `adapter_config.json` + `adapter_model.safetensors` to `dest`.

Factor values (PEFT's `init_lora_weights=False` would leave them to torch's global RNG):
A is drawn uniform in ±1/sqrt(d_in) and B normal from a `torch.Generator(seed)`, in sorted
parameter-name order; then B is rescaled per module so that the effective update
`s * B @ A` has Frobenius norm `delta_scale * ||W_base||_F` (s = alpha/r or alpha/sqrt(r)
for rsLoRA). Outputs therefore change visibly but stay in a sane range for any base.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

DEFAULT_DELTA_SCALE = 0.3
"""Relative Frobenius norm of each module's update against its base weight."""


def make_peft_adapter(
    base_dir: Path,
    dest: Path,
    *,
    seed: int,
    rank: int,
    alpha: int,
    target_modules: list[str],
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, int] | None = None,
    use_rslora: bool = False,
    dtype: str = "float32",
    delta_scale: float = DEFAULT_DELTA_SCALE,
    alora_invocation_tokens: list[int] | None = None,
) -> Path:
    """Create a LoRA adapter for the HF model in `base_dir`, save it to `dest`, return `dest`.

    `dtype` is the saved factor dtype: "float32", "float16" or "bfloat16".
    `alora_invocation_tokens` makes it an activated LoRA (PEFT aLoRA).
    Shapes follow PEFT: `lora_A.weight` [r, d_in], `lora_B.weight` [d_out, r] where r
    comes from `rank_pattern` when a pattern matches the module, else `rank`.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    save_dtype = {"float32": torch.float32, "float16": torch.float16,
                  "bfloat16": torch.bfloat16}[dtype]
    base = AutoModelForCausalLM.from_pretrained(Path(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        rank_pattern=dict(rank_pattern or {}),
        alpha_pattern=dict(alpha_pattern or {}),
        use_rslora=use_rslora,
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
        task_type="CAUSAL_LM",
        alora_invocation_tokens=alora_invocation_tokens,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    _fill_factors(model, generator, delta_scale)
    if save_dtype is not torch.float32:
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(save_dtype)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    return dest


def _fill_factors(model: Any, generator: Any, delta_scale: float) -> None:
    """Overwrite every LoRA layer's A/B deterministically (sorted module-name order)."""
    import torch
    from peft.tuners.lora import LoraLayer

    layers: list[tuple[str, Any]] = sorted(
        ((name, mod) for name, mod in model.named_modules() if isinstance(mod, LoraLayer)),
        key=lambda item: item[0],
    )
    with torch.no_grad():
        for _name, layer in layers:
            for adapter_name, lora_a in layer.lora_A.items():
                lora_b = layer.lora_B[adapter_name]
                a_w: torch.Tensor = lora_a.weight  # [r, d_in]
                b_w: torch.Tensor = lora_b.weight  # [d_out, r]
                bound = 1.0 / math.sqrt(a_w.shape[1])
                a = (torch.rand(a_w.shape, generator=generator) * 2.0 - 1.0) * bound
                b = torch.randn(b_w.shape, generator=generator)
                scaling = float(layer.scaling[adapter_name])
                delta_norm = float(torch.linalg.matrix_norm(scaling * (b @ a)))
                base_norm = float(torch.linalg.matrix_norm(layer.get_base_layer().weight))
                if delta_norm > 0.0:
                    b = b * (delta_scale * base_norm / delta_norm)
                a_w.copy_(a)
                b_w.copy_(b)
