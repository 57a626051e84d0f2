"""CUDA: the Triton prefill path (varlen kernel) against the torch path (SDPA per request)
and a float64 reference at Llama-3-8B head sizes (32 query / 8 KV heads, head_dim 128) and
a head_dim-64 GQA-4 shape, bf16 and fp16, with chunked prefills, a one-row chunk, decode
rows and a Mistral-style sliding window on the second layer."""

from __future__ import annotations

import pytest
import torch

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import build_attention_metadata
from dataplane.attention.paged_attention import paged_attention

from .helpers import make_plan, reference_prefill

BS = 16
WINDOWS = (None, 200)
# (prompt length, computed, this step): fresh 512, chunk 300 after 200, one row after 700,
# fresh 1, fresh 77, chunk 128 after 384; decodes.
PREFILLS = [(512, 0, 512), (600, 200, 300), (701, 700, 1), (1, 0, 1), (77, 0, 77),
            (512, 384, 128)]
DECODES = [40, 1000]


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(32, 8, 128), (16, 4, 64)])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_triton_prefill_matches_torch_path(cuda_device: torch.device, heads: int,
                                           kv_heads: int, dim: int, dtype: torch.dtype,
                                           tol: float) -> None:
    plan = make_plan(PREFILLS, DECODES, BS)
    gen = torch.Generator().manual_seed(heads + dim)
    num_blocks = 3 * sum(len(t) for t in plan.block_tables) + 1
    cache = PagedKVCache(len(WINDOWS), num_blocks, BS, kv_heads, dim, dtype, cuda_device)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    t = plan.num_rows
    metas = {kind: build_attention_metadata(plan, WINDOWS, cuda_device, cache.trash_slot, kind)
             for kind in ("torch", "triton")}
    assert metas["triton"].prefill is not None and not metas["triton"].prefills
    indptr = list(plan.prefill_indptr)
    for layer, window in enumerate(WINDOWS):
        q, k, v = (torch.randn(t, h, dim, generator=gen).to(dtype)
                   for h in (heads, kv_heads, kv_heads))
        outs = {kind: paged_attention(q.to(cuda_device), k.to(cuda_device), v.to(cuda_device),
                                      layer, cache, meta, window, dim ** -0.5).float().cpu()
                for kind, meta in metas.items()}
        p = plan.num_prefills
        want = reference_prefill(q, cache.k[layer].cpu(), cache.v[layer].cpu(), indptr,
                                 list(plan.context_lens[:p]),
                                 [list(b) for b in plan.block_tables[:p]], BS, window,
                                 dim ** -0.5)
        rows = plan.doff
        torch.testing.assert_close(outs["triton"][:rows], outs["torch"][:rows],
                                   atol=tol, rtol=tol)
        torch.testing.assert_close(outs["triton"][:rows].double(), want, atol=tol, rtol=tol)
        torch.testing.assert_close(outs["triton"][rows:], outs["torch"][rows:],
                                   atol=tol, rtol=tol)
