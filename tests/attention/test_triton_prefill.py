"""Triton varlen prefill attention (interpreted on CPU, compiled on CUDA) against a float64
dense reference: several requests of different lengths (incl. 1) packed in one launch,
chunked prefill with earlier context, scattered block tables, GQA, sliding windows,
tiles smaller than the requests (several query and key tiles), fp32/fp16/bf16."""

from __future__ import annotations

import pytest
import torch

from dataplane.attention.metadata import prefill_batch
from dataplane.attention.triton_prefill import varlen_prefill_attention

from .helpers import reference_prefill

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS, NUM_BLOCKS = 4, 40
# (rows this step, context before it): fresh, chunk after context, long fresh, long chunk,
# single-row chunk after a long context, fresh single row.
REQUESTS = [(5, 0), (6, 7), (19, 0), (33, 20), (1, 40), (1, 0)]
EXTRA_ROWS = 3  # decode rows after the prefills: the kernel must not touch them


def _case(heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    indptr, ctx_lens, tables = [0], [], []
    perm = torch.randperm(NUM_BLOCKS, generator=gen).tolist()  # scattered, disjoint tables
    for rows, before in REQUESTS:
        indptr.append(indptr[-1] + rows)
        ctx_lens.append(before + rows)
        need = (before + rows + BS - 1) // BS
        tables.append(perm[:need])
        perm = perm[need:]
    t = indptr[-1] + EXTRA_ROWS
    k_cache = torch.randn(NUM_BLOCKS * BS + 1, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS * BS + 1, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(t, heads, dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, indptr, ctx_lens, tables


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window", "dtype", "tol"), [
    (4, 4, 16, None, torch.float32, 1e-5),
    (4, 2, 16, 6, torch.float32, 1e-5),
    (8, 2, 24, None, torch.float32, 1e-5),  # head_dim not a power of two (padded to 32)
    (8, 2, 16, 21, torch.float32, 1e-5),
    (4, 2, 16, None, torch.float16, 3e-3),
    (4, 1, 16, 9, torch.bfloat16, 2e-2),
])
def test_varlen_prefill_matches_dense_reference(heads: int, kv_heads: int, dim: int,
                                                window: int | None, dtype: torch.dtype,
                                                tol: float) -> None:
    q, k_cache, v_cache, indptr, ctx_lens, tables = _case(heads, kv_heads, dim, dtype,
                                                         seed=heads * 31 + dim)
    batch = prefill_batch(indptr, ctx_lens, tables, BS, DEVICE, block_m=16)
    assert batch.num_tiles == 1 + 1 + 2 + 3 + 1 + 1
    out = torch.full(q.shape, 7.0, dtype=dtype, device=DEVICE)
    varlen_prefill_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch, BS,
                             dim ** -0.5, window, out=out, block_n=16)
    want = reference_prefill(q, k_cache, v_cache, indptr, ctx_lens, tables, BS, window,
                             dim ** -0.5)
    got = out.cpu()
    torch.testing.assert_close(got[:indptr[-1]].double(), want, atol=tol, rtol=tol)
    assert (got[indptr[-1]:] == 7.0).all()  # rows past the prefills untouched


def test_default_launch_config_matches_reference() -> None:
    """The engine's configuration (block_m 64, block_n 64): one tile per request here."""
    q, k_cache, v_cache, indptr, ctx_lens, tables = _case(4, 2, 16, torch.float32, seed=5)
    batch = prefill_batch(indptr, ctx_lens, tables, BS, DEVICE)
    got = varlen_prefill_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE),
                                   batch, BS, 0.3, None).cpu()
    want = reference_prefill(q, k_cache, v_cache, indptr, ctx_lens, tables, BS, None, 0.3)
    torch.testing.assert_close(got[:indptr[-1]].double(), want, atol=1e-5, rtol=1e-5)


def test_prefill_batch_layout() -> None:
    """The tile map covers every row of every request exactly once, heaviest tiles first."""
    batch = prefill_batch([0, 3, 40, 41], [3, 45, 100], [[2], list(range(12)), list(range(25))],
                          BS, torch.device("cpu"), block_m=16)
    rows = sorted(zip(batch.tile_request.tolist(), batch.tile_row.tolist(), strict=True))
    assert rows == [(0, 0), (1, 0), (1, 16), (1, 32), (2, 0)]
    assert int(batch.tile_request[0]) == 2  # the single row at position 99 sees most keys
    assert batch.block_tables.shape == (3, 25)
    assert batch.block_tables[0].tolist() == [2] + [0] * 24
    assert batch.indptr.tolist() == [0, 3, 40, 41] and batch.num_rows == 41


@pytest.mark.parametrize("num_requests", [1, 2, 3, 4, 5, 7])
def test_prefill_batch_segments_are_16_byte_aligned(num_requests: int) -> None:
    """Every tensor the kernel takes starts on a 16-byte boundary whatever the request and
    tile counts (Triton specialises pointers on that alignment: an unaligned segment
    would compile another kernel variant mid-serving), and holds exactly its values."""
    lens = [5 + 17 * r for r in range(num_requests)]
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    ctx = [n + 3 * r for r, n in enumerate(lens)]
    tables = [list(range(r, r + (c + BS - 1) // BS)) for r, c in enumerate(ctx)]
    batch = prefill_batch(indptr, ctx, tables, BS, torch.device("cpu"), block_m=16)
    for t in (batch.indptr, batch.context_lens, batch.block_tables, batch.tile_request,
              batch.tile_row):
        assert t.data_ptr() % 16 == 0
    assert batch.indptr.tolist() == indptr and batch.context_lens.tolist() == ctx
    assert [row[: len(tab)] for row, tab in zip(batch.block_tables.tolist(), tables,
                                                strict=True)] == tables
    assert batch.tile_request.numel() == batch.num_tiles == sum(-(-n // 16) for n in lens)
    assert sorted(batch.tile_request.tolist()) == sorted(
        r for r, n in enumerate(lens) for _ in range(-(-n // 16)))


def test_bad_shapes_raise() -> None:
    q, k_cache, v_cache, indptr, ctx_lens, tables = _case(4, 3, 16, torch.float32, seed=1)
    batch = prefill_batch(indptr, ctx_lens, tables, BS, DEVICE)
    with pytest.raises(ValueError, match="inconsistent"):
        varlen_prefill_attention(q, k_cache, v_cache, batch, BS, 0.25, None)
