"""Page-major KV (views into a page buffer, block stride = page size, the agent's unified
pool) against the private flat-slot cache holding the same K/V: every reader and writer
(fused RoPE + KV write, varlen prefill and paged decode kernels, the torch gather paths,
`PagedKVCache.write`) gives bit-identical results on both layouts, and writes land only in
the KV part of the written slots' pages."""

from __future__ import annotations

import pytest
import torch

from dataplane.attention.kv_cache import KVCacheLayoutError, PagedKVCache
from dataplane.attention.metadata import build_attention_metadata
from dataplane.attention.paged_attention import paged_attention
from dataplane.attention.triton_decode import paged_decode_attention
from dataplane.ops import rope_and_cache

from .helpers import make_plan

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS, HEADS, KV_HEADS, DIM, BLOCKS = 4, 4, 2, 16, 64
WINDOWS = (None, 5)
KV_ELEMS = 2 * len(WINDOWS) * BS * KV_HEADS * DIM
PAGE = KV_ELEMS + 24  # a page wider than one KV block: block stride != BS * Hkv * D
SENTINEL = 7.0


def _caches(seed: int) -> tuple[PagedKVCache, PagedKVCache]:
    """(page-major, private) caches with identical random K/V in every slot."""
    pages = torch.full((BLOCKS + 1, PAGE), SENTINEL, device=DEVICE)
    paged = PagedKVCache.in_pages(pages, len(WINDOWS), BS, KV_HEADS, DIM)
    flat = PagedKVCache(len(WINDOWS), BLOCKS, BS, KV_HEADS, DIM, torch.float32, DEVICE)
    gen = torch.Generator().manual_seed(seed)
    flat.k.copy_(torch.randn(flat.k.shape, generator=gen))
    flat.v.copy_(torch.randn(flat.v.shape, generator=gen))
    for layer in range(len(WINDOWS)):
        for src, dst in ((flat.k[layer], paged.k[layer]), (flat.v[layer], paged.v[layer])):
            slots = torch.arange(flat.num_slots + 1, device=DEVICE)
            dst[slots // BS, slots % BS] = src
    return paged, flat


def _slots_of(cache: PagedKVCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of every slot (trash included) as [num_slots + 1, Hkv, D]."""
    if cache.pages is None:
        return cache.k[layer], cache.v[layer]
    slots = torch.arange(cache.num_slots + 1, device=DEVICE)
    return (cache.k[layer][slots // BS, slots % BS], cache.v[layer][slots // BS, slots % BS])


def test_views_are_page_major_and_allocate_nothing() -> None:
    paged, _ = _caches(0)
    assert paged.pages is not None
    assert paged.k[0].shape == (BLOCKS + 1, BS, KV_HEADS, DIM)
    assert paged.k[0].stride(0) == PAGE != BS * KV_HEADS * DIM
    base, elem = paged.pages.data_ptr(), paged.pages.element_size()
    for layer in range(len(WINDOWS)):  # page p = [layers][K, V][BS][Hkv][D]
        for kind, t in enumerate((paged.k[layer], paged.v[layer])):
            off = (t[3, 1, 1, 2].data_ptr() - base) // elem
            assert off == 3 * PAGE + (2 * layer + kind) * BS * KV_HEADS * DIM \
                + 1 * KV_HEADS * DIM + 1 * DIM + 2
    # the padded tail of every page is no KV element
    assert bool((paged.pages[:, KV_ELEMS:] == SENTINEL).all())
    assert paged.trash_slot == BLOCKS * BS and paged.num_slots == BLOCKS * BS


def test_buffer_too_small_is_refused() -> None:
    with pytest.raises(KVCacheLayoutError):
        PagedKVCache.in_pages(torch.zeros(4, KV_ELEMS - 1), len(WINDOWS), BS, KV_HEADS, DIM)
    with pytest.raises(KVCacheLayoutError):
        PagedKVCache.in_pages(torch.zeros(1, KV_ELEMS), len(WINDOWS), BS, KV_HEADS, DIM)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_paged_attention_same_on_both_layouts(kernel: str) -> None:
    plan = make_plan([(9, 0, 9), (20, 10, 6), (14, 13, 1)], [8, 1], BS)
    paged, flat = _caches(1)
    meta = build_attention_metadata(plan, WINDOWS, DEVICE, flat.trash_slot, kernel)
    gen = torch.Generator().manual_seed(2)
    t = plan.num_rows
    written = torch.tensor(plan.slot_mapping, device=DEVICE)
    for layer, window in enumerate(WINDOWS):
        q, k, v = (torch.randn(t, h, DIM, generator=gen).to(DEVICE)
                   for h in (HEADS, KV_HEADS, KV_HEADS))
        got = paged_attention(q, k, v, layer, paged, meta, window, DIM ** -0.5)
        want = paged_attention(q, k, v, layer, flat, meta, window, DIM ** -0.5)
        assert torch.equal(got, want)
        for a, b in zip(_slots_of(paged, layer), _slots_of(flat, layer), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(_slots_of(paged, layer)[0][written], k)
    assert paged.pages is not None
    assert bool((paged.pages[:, KV_ELEMS:] == SENTINEL).all())  # tails untouched


def test_decode_kernel_refuses_a_mismatched_block_size() -> None:
    paged, _ = _caches(3)
    q = torch.zeros(1, HEADS, DIM, device=DEVICE)
    one = torch.ones(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError):
        paged_decode_attention(q, paged.k[0], paged.v[0], one[None], one, one - 1, BS * 2,
                               1.0, None)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_rope_and_cache_same_on_both_layouts(backend: str) -> None:
    paged, flat = _caches(4)
    t = 5
    gen = torch.Generator().manual_seed(5)
    slots = torch.tensor([7, 2, 9, 255, BLOCKS * BS], device=DEVICE)  # incl. the trash slot
    angles = torch.rand(t, DIM // 2, generator=gen).to(DEVICE) * 6.28
    cos, sin = angles.cos(), angles.sin()
    qkv = torch.randn(t, (HEADS + 2 * KV_HEADS) * DIM, generator=gen).to(DEVICE)
    outs = []
    for cache in (paged, flat):
        x = qkv.clone()
        q = x[:, :HEADS * DIM].view(t, HEADS, DIM)
        k = x[:, HEADS * DIM:(HEADS + KV_HEADS) * DIM].view(t, KV_HEADS, DIM)
        v = x[:, (HEADS + KV_HEADS) * DIM:].view(t, KV_HEADS, DIM)
        outs.append(rope_and_cache(q, k, v, cos, sin, cache.k[1], cache.v[1], slots, backend))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    for layer in range(len(WINDOWS)):
        for a, b in zip(_slots_of(paged, layer), _slots_of(flat, layer), strict=True):
            assert torch.equal(a, b)
    assert torch.equal(_slots_of(paged, 1)[0][slots], outs[0][1])
    assert paged.pages is not None
    assert bool((paged.pages[:, KV_ELEMS:] == SENTINEL).all())


def test_check_geometry_names_a_mismatch() -> None:
    paged, _ = _caches(6)
    dims = (len(WINDOWS), BLOCKS, BS, KV_HEADS, DIM)
    paged.check_geometry(*dims, torch.float32, DEVICE)
    for bad in ((len(WINDOWS) + 1, BLOCKS, BS, KV_HEADS, DIM), (len(WINDOWS), BLOCKS - 1, BS,
                                                               KV_HEADS, DIM)):
        with pytest.raises(KVCacheLayoutError):
            paged.check_geometry(*bad, torch.float32, DEVICE)
    with pytest.raises(KVCacheLayoutError):
        paged.check_geometry(*dims, torch.bfloat16, DEVICE)
