"""Write one compressed member as an ordinary PEFT LoRA directory.

`U Σ_i Vᵀ = (U Σ_i)(Vᵀ)`: the member is a rank-R LoRA with `B = U Σ_i`, `A = Vᵀ` and scale
1 (`lora_alpha = r = R`). Pushed as an artifact it is validated, published and served like
any adapter, which lets a user compare it with its source before switching traffic.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from dataplane.collections.bundle import CollectionBundle
from dataplane.collections.errors import CollectionError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def write_member_peft(bundle: CollectionBundle, index: int, directory: Path,
                      dtype: str = "float32") -> Path:
    if not 0 <= index < len(bundle.assignment):
        raise CollectionError("member index out of range", index=index,
                              members=len(bundle.assignment))
    if dtype not in DTYPES:
        raise CollectionError(f"unsupported dtype {dtype!r}", supported=sorted(DTYPES))
    tensors: dict[str, torch.Tensor] = {}
    roles = set()
    for module in bundle.modules:
        b, a = bundle.lora_factors(index, module)
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.to(DTYPES[dtype]).contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.to(DTYPES[dtype]).contiguous()
        roles.add(module.rsplit(".", 1)[-1])
    rank = int(bundle.manifest["rank"])
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "use_rslora": False,
              "target_modules": sorted(roles), "bias": "none", "lora_dropout": 0.0,
              "task_type": "CAUSAL_LM"}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory
