"""Triton paged decode attention (compiled on CUDA, interpreted on CPU) against a float64
dense reference: scattered block tables, GQA groups 1/2/4, sliding windows, fp32/fp16/bf16."""

from __future__ import annotations

import pytest
import torch

from dataplane.attention.triton_decode import paged_decode_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               tables: torch.Tensor, lens: torch.Tensor, bs: int, window: int | None
               ) -> torch.Tensor:
    """Each row alone, in float64, keys gathered position by position."""
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // k_cache.shape[1]
    for r in range(q.shape[0]):
        n = int(lens[r])
        keep = [p for p in range(n) if window is None or (n - 1) - p < window]
        slots = [int(tables[r, p // bs]) * bs + p % bs for p in keep]
        k = k_cache[slots].double().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[r].double(), k) * q.shape[-1] ** -0.5
        out[r] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v)
    return out


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float16, 3e-3),
                                            (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(4, 4, None), (4, 2, 7), (8, 2, None)])
@pytest.mark.parametrize(("splits", "block_n"), [(1, 32), (1, 64), (2, 16), (4, 16), (8, 32),
                                                 (2, 64)])
def test_paged_decode_matches_dense_reference(dtype: torch.dtype, tol: float, heads: int,
                                              kv_heads: int, window: int | None, splits: int,
                                              block_n: int) -> None:
    """Split-KV: 2-8 programs per (row, KV head) over runs of 16- to 64-key tiles, some
    runs empty (the one-key row; 8 splits of the 37-key row), combined in a second launch."""
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    rows, dim, bs, blocks = 3, 16, 4, 24
    k_cache = torch.randn(blocks * bs + 1, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(blocks * bs + 1, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(rows, heads, dim, generator=gen).to(dtype)
    lens = torch.tensor([1, 37, 64])  # one key, a partial tile, exactly two tiles
    tables = torch.stack([torch.randperm(blocks, generator=gen)[:16] for _ in range(rows)])
    dev = [t.to(DEVICE) for t in (q, k_cache, v_cache, tables, lens)]
    got = paged_decode_attention(dev[0], dev[1], dev[2], dev[3], dev[4], dev[4] - 1, bs,
                                 dim ** -0.5, window, splits=splits, block_n=block_n).cpu()
    want = _reference(q, k_cache, v_cache, tables, lens, bs, window)
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_bad_split_or_tile_is_refused() -> None:
    q = torch.zeros(1, 4, 16, device=DEVICE)
    cache = torch.zeros(17, 4, 16, device=DEVICE)
    table = torch.zeros(1, 4, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    for kw in ({"splits": 3}, {"splits": 0}, {"block_n": 24}):
        with pytest.raises(ValueError, match="powers of two"):
            paged_decode_attention(q, cache, cache, table, lens, lens - 1, 4, 0.25, None,
                                   **kw)  # type: ignore[arg-type]

