"""`paged_attention` on a real mixed BatchPlan (fresh prefill, chunked prefills after earlier
context incl. a one-row chunk, decode rows; scattered blocks): the Triton path (varlen
prefill + paged decode kernels, one PrefillBatch shared by all layers) and the torch path
(SDPA per request) both equal a float64 dense reference, with and without a window."""

from __future__ import annotations

import pytest
import torch

from dataplane.attention.kv_cache import PagedKVCache
from dataplane.attention.metadata import build_attention_metadata
from dataplane.attention.paged_attention import paged_attention
from dataplane.core import BatchPlan

from .helpers import make_plan, reference_prefill

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS, HEADS, KV_HEADS, DIM = 4, 4, 2, 16
WINDOWS = (None, 5)  # layer 0 full attention, layer 1 sliding window (Mistral-style)


def _plan() -> BatchPlan:
    # (prompt length, tokens already computed, tokens this step); decodes: prompt length
    return make_plan([(9, 0, 9), (20, 10, 6), (14, 13, 1)], [8, 1], BS)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_paths_match_dense_reference(kernel: str) -> None:
    plan = _plan()
    gen = torch.Generator().manual_seed(3)
    cache = PagedKVCache(len(WINDOWS), 64, BS, KV_HEADS, DIM, torch.float32, DEVICE)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))  # earlier context
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    t = plan.num_rows
    meta = build_attention_metadata(plan, WINDOWS, DEVICE, cache.trash_slot, kernel)
    assert (meta.prefill is not None) == (kernel == "triton")
    assert (len(meta.prefills) == 3) == (kernel == "torch")
    for layer, window in enumerate(WINDOWS):
        q, k, v = (torch.randn(t, h, DIM, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
        got = paged_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), layer, cache, meta,
                              window, DIM ** -0.5).cpu()
        # Every request (a decode row = a one-row request) against the cache after the write.
        r = plan.num_prefills + plan.num_decodes
        indptr = list(plan.prefill_indptr) + list(range(plan.doff + 1, t + 1))
        assert len(indptr) == r + 1
        want = reference_prefill(q, cache.k[layer].cpu(), cache.v[layer].cpu(), indptr,
                                 list(plan.context_lens), [list(b) for b in plan.block_tables],
                                 BS, window, DIM ** -0.5)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
