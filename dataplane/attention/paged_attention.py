"""Attention over packed prefill + decode rows with a paged KV cache (torch SDPA path).

Works on CPU and CUDA. Per layer: write this step's K/V into their KV slots, then
- each prefill request: its rows attend to its own context (this chunk's fresh keys when the
  chunk starts at position 0, else the cache gathered through its block table);
- all decode rows in one padded batch: each row attends to its own cached keys.
Masks come from `AttentionMetadata` (built once per step). GQA through `enable_gqa`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import AttentionMetadata


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                    cache: PagedKVCache, meta: AttentionMetadata, window: int | None,
                    scale: float) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (RoPE applied) -> out [T, Hq, D] in q's dtype."""
    cache.write(layer, meta.slot_mapping, k, v)
    out = torch.empty_like(q)
    k_all, v_all = cache.k[layer], cache.v[layer]
    for seg in meta.prefills:
        qs = q[seg.start:seg.end]
        if seg.fresh:
            ks, vs = k[seg.start:seg.end], v[seg.start:seg.end]
        else:
            ks, vs = k_all[seg.key_slots], v_all[seg.key_slots]
        mask = seg.masks[window]
        res = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
            attn_mask=mask[None, None], scale=scale, enable_gqa=True)
        out[seg.start:seg.end] = res[0].transpose(0, 1)
    if meta.decode is not None:
        slots = meta.decode.key_slots  # [D, L]
        kd = k_all[slots].transpose(1, 2)  # [D, Hkv, L, hd]
        vd = v_all[slots].transpose(1, 2)
        qd = q[meta.doff:, :, None, :]  # [D, Hq, 1, hd]
        mask = meta.decode.masks[window][:, None, None, :]
        res = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
        out[meta.doff:] = res[:, :, 0, :]
    return out
