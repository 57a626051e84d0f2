# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""The base projection and the LoRA expand in one kernel, for decode-sized steps.

``y[t, cols] = x[t] @ W[cols]^T + scale * z[t, slice] @ Bt[slice, slot(t)][:, cols]``

Why: at decode sizes the LoRA branch as a launch of its own pays a fixed 6-8 µs per
module (launch, prologue, split-K exchange; ``bench/lora_anatomy.py``) plus a
read-modify-write of ``y``, while the base GEMM streams the weight from HBM anyway. Here
each output tile's programs compute the base product and add the LoRA expand before the
tile's single store: ``y`` is written once.

Decomposition: programs ``(column tile, K split)`` x row tiles. ``SPLIT_K > 1``: each
program publishes its fp32 partial tile to ``ws``, arrives at the tile's counter, and the
last to arrive sums the partials in split order (deterministic), resets the counter and
stores; nobody waits. The LoRA expand is gathered per row (Punica's BGMV form): for
rank row ``i``, ``acc[t, :] += scale(t) * z[t, i] * Bt_slot(t)[i, cols]`` — the rows stay
in scheduler order, every load is independent of the previous iteration (pipelined),
rows sharing an adapter read the same factor bytes from L2. Split ``ks`` takes rank rows
``ks, ks + SPLIT_K, ...``, so the expand is shared by the tile's programs.

The bottleneck ``z`` comes from the segmented shrink (``lora_shrink_kernel``) launched
just before; its ``eff`` split-K partials are summed as the expand sums them (same
constexprs, so the same count). With ``PDL`` the launch is a programmatic dependent
one: the base product (``x`` and ``W`` only) may run while the shrink drains;
``gdc_wait`` comes before ``z`` is read and before the counters are touched.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dataplane.kernels.triton.lora_kernels import _eff_split, _pick, _total_tiles


@triton.jit
def _lora_rows(acc, m, mmask, n, nmask, ks, z_ptr, storage_ptr, b_rows_ptr, ranks_ptr,
               scales_ptr, row_slot_ptr, counts_ptr, T, N, S, NS, R_MAX, W0, W1, W2, W3,
               BLOCK_N: tl.constexpr, S_PAD: tl.constexpr, SPLIT_K: tl.constexpr,
               SH_BLOCK_M: tl.constexpr, SPLIT_MAX: tl.constexpr, TARGET: tl.constexpr,
               STAGES: tl.constexpr):  # fmt: skip
    """``acc`` plus this split's rank rows of every row's expand on this column tile."""
    col0 = tl.program_id(0) // SPLIT_K * BLOCK_N
    sl = ((col0 >= W0).to(tl.int32) + (col0 >= W0 + W1).to(tl.int32)
          + (col0 >= W0 + W1 + W2).to(tl.int32))  # fmt: skip
    nsl = n - _pick(sl, 0, W0, W0 + W1, W0 + W1 + W2)
    nok = nmask & (nsl < _pick(sl, W0, W1, W2, W3))
    eff = _eff_split(_total_tiles(counts_ptr, S, SH_BLOCK_M, S_PAD), SPLIT_MAX, TARGET)
    slot = tl.load(row_slot_ptr + m, mask=mmask, other=-1)
    has = mmask & (slot >= 0)
    idx = sl * S + tl.maximum(slot, 0)
    rank = tl.load(ranks_ptr + idx, mask=has, other=0)
    scale = tl.load(scales_ptr + idx, mask=has, other=0.0)
    for i in tl.range(ks, R_MAX, SPLIT_K, num_stages=STAGES):
        live = has & (i < rank)
        zi = tl.zeros_like(scale)
        for sp in range(eff):
            zi += tl.load(z_ptr + ((sp * T + m) * NS + sl) * R_MAX + i, mask=live, other=0.0)
        home = tl.load(b_rows_ptr + idx * R_MAX + i, mask=live, other=0)
        bt = tl.load(storage_ptr + home[:, None] + nsl[None, :],
                     mask=live[:, None] & nok[None, :], other=0.0)  # fmt: skip
        acc += (zi * scale)[:, None] * bt.to(tl.float32)
    return acc


# T varies per step, the slice widths per module: one compile for all of them
@triton.jit(do_not_specialize=["T", "W0", "W1", "W2", "W3"])
def linear_lora_kernel(
    x_ptr, w_ptr, y_ptr, z_ptr, storage_ptr, b_rows_ptr, ranks_ptr, scales_ptr,
    row_slot_ptr, counts_ptr, ws_ptr, ctr_ptr,
    T, K, N, S, NS, R_MAX, stride_xm, stride_wn, stride_ym, W0, W1, W2, W3,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, S_PAD: tl.constexpr, STAGES: tl.constexpr,
    SH_BLOCK_M: tl.constexpr, SPLIT_MAX: tl.constexpr, TARGET: tl.constexpr,
    LORA: tl.constexpr, PDL: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0) // SPLIT_K
    ks = tl.program_id(0) % SPLIT_K
    pid_m = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = m < T
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(ks * k_per, tl.minimum(K, ks * k_per + k_per), BLOCK_K,
                       num_stages=STAGES):  # fmt: skip
        k = k0 + kk
        kmask = k < K
        xt = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                     mask=mmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        wt = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None],
                     mask=nmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
        if UPCAST:
            xt = xt.to(tl.float32)
            wt = wt.to(tl.float32)
        acc += tl.dot(xt, wt, input_precision=PREC)
    if PDL:  # z (the shrink's) and the counters only once the previous launch is done
        tl.extra.cuda.gdc_wait()
    if LORA:
        acc = _lora_rows(acc, m, mmask, n, nmask, ks, z_ptr, storage_ptr, b_rows_ptr,
                         ranks_ptr, scales_ptr, row_slot_ptr, counts_ptr, T, N, S, NS, R_MAX,
                         W0, W1, W2, W3, BLOCK_N, S_PAD, SPLIT_K, SH_BLOCK_M, SPLIT_MAX,
                         TARGET, STAGES)  # fmt: skip
    ymask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + m[:, None] * stride_ym + n[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=ymask)  # fmt: skip
    else:
        q = pid_m * tl.num_programs(0) // SPLIT_K + pid_n
        loc = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile = ws_ptr + q * (SPLIT_K * BLOCK_M * BLOCK_N) + loc
        tl.store(tile + ks * (BLOCK_M * BLOCK_N), acc)
        tl.debug_barrier()  # every thread's partial is written before the release
        if tl.atomic_add(ctr_ptr + q, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for sp in tl.static_range(SPLIT_K):  # split order: the same sum every time
                total += tl.load(tile + sp * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
            tl.atomic_xchg(ctr_ptr + q, 0, sem="relaxed", scope="gpu")
            tl.store(y_ptr + m[:, None] * stride_ym + n[None, :],
                     total.to(y_ptr.dtype.element_ty), mask=ymask)  # fmt: skip
