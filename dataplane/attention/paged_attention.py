"""Attention over packed prefill + decode rows with a paged KV cache (torch SDPA path).

Works on CPU and CUDA. Per layer: write this step's K/V into their KV slots (unless the
caller's fused RoPE kernel did), then
- all prefill rows at once through the Triton varlen kernel (`meta.prefill` set; K/V read in
  place from the cache, this step's included), or, on the torch path, each prefill request
  alone: its rows attend to its own context (this chunk's fresh keys when the chunk starts at
  position 0, else the cache gathered through its block table);
- all decode rows at once: each row attends to its own cached keys, either through the
  Triton paged kernel (K/V read in place, CUDA) or a gather of each row's whole KV blocks
  (one row copy per block, not per slot) + one SDPA call (torch path).
Masks come from `AttentionMetadata` (built once per step). GQA through `enable_gqa`.
Either KV layout of `PagedKVCache` (private flat slots or page-major pool views) works:
slots are turned into addresses by `kv_cache.gather_slots` / `gather_blocks` / the kernels'
block strides.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.attention.kv_cache import PagedKVCache, gather_blocks, gather_slots
from dataplane.attention.metadata import AttentionMetadata


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                    cache: PagedKVCache, meta: AttentionMetadata, window: int | None,
                    scale: float, write_kv: bool = True,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (RoPE applied) -> out [T, Hq, D] in q's dtype.

    `write_kv=False`: the caller already stored k/v at `meta.slot_mapping` (the fused
    `dataplane.ops.rope_and_cache` does). `out`: a [T, Hq, D] buffer to write (a static
    buffer of the piecewise graphs); None allocates one."""
    if write_kv:
        cache.write(layer, meta.slot_mapping, k, v)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError("paged_attention: out must match q's shape and dtype")
    k_all, v_all = cache.k[layer], cache.v[layer]
    if meta.prefill is not None:
        from dataplane.attention.triton_prefill import varlen_prefill_attention

        varlen_prefill_attention(q, k_all, v_all, meta.prefill, cache.block_size, scale,
                                 window, out=out)
    for seg in meta.prefills:
        qs = q[seg.start:seg.end]
        if seg.fresh:
            ks, vs = k[seg.start:seg.end], v[seg.start:seg.end]
        else:
            ks, vs = gather_slots(k_all, seg.key_slots), gather_slots(v_all, seg.key_slots)
        mask = seg.masks.get(window)
        res = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
            attn_mask=None if mask is None else mask[None, None], is_causal=mask is None,
            scale=scale, enable_gqa=True)
        out[seg.start:seg.end] = res[0].transpose(0, 1)
    if meta.decode is not None and meta.decode_kernel == "triton":
        from dataplane.attention.triton_decode import paged_decode_attention

        dec = meta.decode
        paged_decode_attention(
            q[meta.doff:], k_all, v_all, dec.block_tables, dec.context_lens, dec.positions,
            cache.block_size, scale, window, out=out[meta.doff:])
    elif meta.decode is not None:
        if meta.decode.masks is None:
            raise ValueError("torch decode path needs the decode masks")
        mask = meta.decode.masks[window]  # [D, L]
        blocks = meta.decode.block_tables[:, :-(-mask.shape[1] // cache.block_size)]
        width = mask.shape[1]
        out[meta.doff:] = grouped_decode(
            q[meta.doff:], gather_blocks(k_all, blocks, cache.block_size)[:, :width],
            gather_blocks(v_all, blocks, cache.block_size)[:, :width], mask, scale)
    return out


def grouped_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """One query row per request, GQA without repeating K/V (torch path).

    q [D, Hq, Dh], k/v [D, L, Hkv, Dh] (gathered context, any strides), mask [D, L] bool
    -> [D, Hq, Dh]. One SDPA call over all rows: K/V are read through transposed views
    (no copy into a matmul layout) and the G = Hq / Hkv query heads of a KV head share
    them (`enable_gqa`).
    """
    res = F.scaled_dot_product_attention(
        q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None],
        scale=scale, enable_gqa=True)
    return res[:, :, 0]
