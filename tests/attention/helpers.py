"""Float64 dense reference for prefill attention over a paged KV cache (independent of the
kernels: explicit per-request causal/window masks, keys gathered position by position)."""

from __future__ import annotations

import torch

from dataplane.core import BatchPlan, Sequence, build_batch_plan


def make_plan(prefills: list[tuple[int, int, int]], decodes: list[int], block_size: int,
              first_block: int = 0) -> BatchPlan:
    """A real BatchPlan. prefills: (prompt length, tokens already computed, tokens this step);
    decodes: prompt lengths (all but the last token computed). Blocks are handed out
    scattered (every third id, descending from `first_block` + enough room)."""
    seqs: list[Sequence] = []
    chunks: list[tuple[Sequence, int]] = []
    for i, (n, done, new) in enumerate(prefills):
        s = Sequence(f"p{i}", tuple(range(1, n + 1)))
        s.num_computed_tokens = done
        chunks.append((s, new))
        seqs.append(s)
    dec = []
    for i, n in enumerate(decodes):
        s = Sequence(f"d{i}", tuple(range(1, n + 1)))
        s.num_computed_tokens = n - 1
        dec.append(s)
        seqs.append(s)
    total = sum((s.num_tokens + block_size - 1) // block_size for s in seqs)
    block = first_block + 3 * total
    for s in seqs:
        while len(s.block_table) * block_size < s.num_tokens:
            s.block_table.append(block)
            block -= 3
    return build_batch_plan(chunks, dec, block_size=block_size, generation=1)


def reference_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      indptr: list[int], context_lens: list[int], tables: list[list[int]],
                      block_size: int, window: int | None, scale: float) -> torch.Tensor:
    """q [T, Hq, D] -> float64 [indptr[-1], Hq, D]; request p's rows sit at positions
    [ctx_p - len_p, ctx_p) and see keys 0..ctx_p-1 of their own request only."""
    group = q.shape[1] // k_cache.shape[1]
    out = torch.empty(indptr[-1], q.shape[1], q.shape[2], dtype=torch.float64)
    for p, ctx in enumerate(context_lens):
        start, end = indptr[p], indptr[p + 1]
        slots = [tables[p][j // block_size] * block_size + j % block_size for j in range(ctx)]
        k = k_cache[slots].double().repeat_interleave(group, dim=1)  # [C, Hq, D]
        v = v_cache[slots].double().repeat_interleave(group, dim=1)
        q_pos = torch.arange(ctx - (end - start), ctx)[:, None]
        k_pos = torch.arange(ctx)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= q_pos - k_pos < window
        scores = torch.einsum("qhd,khd->hqk", q[start:end].double(), k) * scale
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out
