"""RoPE on q and k in place, fused with writing k and v into their paged KV cache slots.

    rope_and_cache(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> (q', k')

q [T, Hq, D], k/v [T, Hkv, D] (views of the fused qkv output are fine: any row and head
stride, unit inner stride). cos/sin [T, D/2] in the activation dtype: the step's
half-width table from `RotaryEmbedding.cos_sin` (every RoPE variant, attention factor
included, lives in it). HF's rotate_half convention:

    x' = [x1 * c - x2 * s, x2 * c + x1 * s]   with x = [x1, x2] split at D/2

k_cache/v_cache [S, Hkv, D] are one layer's flat KV slots, or [B, block_size, Hkv, D]
blocked views with any block stride (page-major KV in the agent's unified pool; slot
s = block s // block_size, offset s % block_size); slot_mapping [T] int64 is each row's
slot (the trash slot for graph padding). Afterwards k_cache[slot[t]] = k'[t] and
v_cache[slot[t]] = v[t].

Triton (ops/triton/rotary_kv.py): one program per (row, head) of q and k (grid
(T, Hq + Hkv)); q and k are rotated in place (no allocation), in fp32 with one rounding.
The torch reference returns new q', k' computed in the dtype (HF's roundings) and writes
the cache with index_copy_.
"""

from __future__ import annotations

import torch

from dataplane.attention.kv_cache import write_slots
from dataplane.ops.backend import use_triton
from dataplane.ops.lora_fold import FoldedExpand, add_folded


def apply_rotary_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Reference: x [T, H, D] rotated by half-width cos/sin [T, D/2], in x's dtype.

    Bit-identical to HF's `x * cat(c, c) + rotate_half(x) * cat(s, s)`.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, backend: str = "auto",
                   fold: FoldedExpand | None = None, tail: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k); k and v stored at their KV slots (module docstring). With `fold`
    and `tail` (the q/k/v GEMM's z columns, dataplane/ops/lora_fold.py) q, k and v first
    get each row's LoRA expand; v is updated in place."""
    if not use_triton(q, backend):
        if fold is not None and tail is not None:
            t, (hq, dim), hkv = q.shape[0], q.shape[1:], k.shape[1]
            fold.check(tail, (hq * dim, hkv * dim, hkv * dim))
            q = add_folded(q.reshape(t, -1), tail, fold, 0).view(t, hq, dim)
            k = add_folded(k.reshape(t, -1), tail, fold, 1).view(t, hkv, dim)
            v.copy_(add_folded(v.reshape(t, -1), tail, fold, 2).view(t, hkv, dim))
        q, k = apply_rotary_torch(q, cos, sin), apply_rotary_torch(k, cos, sin)
        write_slots(k_cache, slot_mapping, k)
        write_slots(v_cache, slot_mapping, v)
        return q, k
    from dataplane.ops.triton.rotary_kv import rope_and_cache_triton

    return rope_and_cache_triton(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, fold,
                                 tail)
