# mypy: disable-error-code="no-untyped-def"
# (Triton JIT kernels take untyped pointer/scalar arguments.)
"""The gate/up expand folded into SiLU·mul: ``out = silu(g + Δg) * (u + Δu)``.

``gate_up`` ``[T, 2I]`` is the base projection's output (left unmodified); for a
row of slot ``s``, ``Δg = scale[0, s] * z[0] @ Bt[0, s]`` and ``Δu`` likewise with
slice 1; rows without a slot (and slices of rank 0) get an exact zero delta.
Separately, the expand reads and writes all of ``gate_up`` and the activation
reads it again: at T = 4,096 for Llama-8B (2I = 28,672) that round trip is
470 MB per layer. Here ``gate_up`` is read once and ``out`` written once.

Grid axis 0 enumerates the (slot, row tile) pairs of the shrink's
decomposition (``lora_kernels.py``) and then the row tiles of the ``-1`` run
(the tail of ``sorted_rows``); axis 1 the column spans of ``I``. Every row is
covered by exactly one tile. fp32 math, one rounding to the output dtype (the
unfused path rounds ``g + Δg`` to the dtype before the activation).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dataplane.intmath import cdiv
from dataplane.kernels.triton.expand_kernel import _expand_acc, _load_z
from dataplane.kernels.triton.lora_kernels import _eff_split, _slot_split, _slot_tile, _total_tiles


@triton.jit
def _silu_mul_store(g, u, out_ptr, rows, mmask, n, nmask, stride_om):
    act = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + rows[:, None] * stride_om + n[None, :],
             act.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])  # fmt: skip


@triton.jit
def _load_gate_up(yrow, n, mmask, nmask, INTER: tl.constexpr):
    """fp32 gate and up tiles of columns ``n`` for the rows at ``yrow``."""
    ymask = mmask[:, None] & nmask[None, :]
    g = tl.load(yrow + n[None, :], mask=ymask, other=0.0).to(tl.float32)
    u = tl.load(yrow + INTER + n[None, :], mask=ymask, other=0.0).to(tl.float32)
    return g, u


@triton.jit
def _bt_tile(storage_ptr, homes, r, rank, n, nmask):
    """The first rank chunk of ``Bt[:, n]`` (zero beyond the rank and the columns)."""
    return tl.load(storage_ptr + homes[:, None] + n[None, :],
                   mask=(r < rank)[:, None] & nmask[None, :], other=0.0)  # fmt: skip


@triton.jit
def _delta(z0, bt, storage_ptr, z_ptr, table, rows, mmask, sl, n, nmask, rank, T,
           R_MAX, eff, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, ALIGN: tl.constexpr,
           UPCAST: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """fp32 ``z @ Bt[:, n]`` of slice ``sl`` (2 slices) for one column tile, its first
    rank chunk ``bt`` given (``_bt_tile``)."""
    return _expand_acc(
        z0, bt, z_ptr, storage_ptr, table, rows, mmask, sl, n, nmask, rank, T, 2, R_MAX, eff,
        BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
    )  # fmt: skip


@triton.jit(do_not_specialize=["T"])  # T varies per step: one compile
def lora_expand_silu_kernel(
    y_ptr, out_ptr, z_ptr, storage_ptr, b_rows_ptr, ranks_ptr, scales_ptr,
    sorted_ptr, counts_ptr, starts_ptr,
    S, T, R_MAX, stride_ym, stride_om,
    INTER: tl.constexpr, SPLIT_MAX: tl.constexpr, TARGET: tl.constexpr,
    SHRINK_BM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    N_ITERS: tl.constexpr, BLOCK_R: tl.constexpr, S_PAD: tl.constexpr, ALIGN: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, ROW_SPLIT: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    """One (row tile, column span) of ``out [T, INTER]`` (module docstring).

    ``PREFETCH``: the column loop of an adapter's rows loads the next tile's gate, up
    and factor tiles before it computes this one (else each tile's loads wait in turn).
    """
    if PDL:  # launched early: the shrink's z and the GEMM's gate/up only after this
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    slot, tile, total = _slot_tile(pid, counts_ptr, S, BLOCK_M, S_PAD)
    n0 = tl.program_id(1) * (N_ITERS * BLOCK_N) + tl.arange(0, BLOCK_N)
    r = tl.arange(0, BLOCK_R)
    if pid >= total:  # the run of rows without an adapter
        cols = tl.arange(0, S_PAD)
        start = tl.sum(tl.load(counts_ptr + cols, mask=cols < S, other=0), axis=0)
        m = start + (pid - total) * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < T
        rows = tl.load(sorted_ptr + m, mask=mmask, other=0).to(tl.int64)
        yrow = y_ptr + rows[:, None] * stride_ym
        for ni in range(N_ITERS):
            n = n0 + ni * BLOCK_N
            nmask = n < INTER
            g, u = _load_gate_up(yrow, n, mmask, nmask, INTER)
            _silu_mul_store(g, u, out_ptr, rows, mmask, n, nmask, stride_om)
    else:
        table_g = b_rows_ptr + slot * R_MAX
        table_u = b_rows_ptr + (S + slot) * R_MAX
        homes_g = tl.load(table_g + r, mask=r < R_MAX, other=0)
        homes_u = tl.load(table_u + r, mask=r < R_MAX, other=0)
        if ALIGN > 1:
            homes_g = tl.multiple_of(homes_g, ALIGN)
            homes_u = tl.multiple_of(homes_u, ALIGN)
        rank_g = tl.load(ranks_ptr + slot)
        rank_u = tl.load(ranks_ptr + S + slot)
        # 0 where the slice is absent: its (masked) delta is 0 and 0 * scale must be too
        scale_g = tl.where(rank_g > 0, tl.load(scales_ptr + slot), 0.0)
        scale_u = tl.where(rank_u > 0, tl.load(scales_ptr + S + slot), 0.0)
        count = tl.load(counts_ptr + slot)
        start = tl.load(starts_ptr + slot)
        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < count
        rows = tl.load(sorted_ptr + start + m, mask=mmask, other=0).to(tl.int64)
        eff = _eff_split(_total_tiles(counts_ptr, S, SHRINK_BM, S_PAD), SPLIT_MAX, TARGET)
        eff = _slot_split(eff, count, SPLIT_MAX, SHRINK_BM, ROW_SPLIT)
        zg = _load_z(z_ptr, rows, mmask, 0, r, r < rank_g, T, 2, R_MAX, eff, BLOCK_M, BLOCK_R)
        zu = _load_z(z_ptr, rows, mmask, 1, r, r < rank_u, T, 2, R_MAX, eff, BLOCK_M, BLOCK_R)
        if not UPCAST:
            zg = zg.to(storage_ptr.dtype.element_ty)
            zu = zu.to(storage_ptr.dtype.element_ty)
        yrow = y_ptr + rows[:, None] * stride_ym
        # No branch on the ranks in the loop (it would keep the dot out of the
        # pipeline): a rank-0 slice loads no factor rows, its delta is exactly 0.
        if PREFETCH:
            n0ok = n0 < INTER
            g_next, u_next = _load_gate_up(yrow, n0, mmask, n0ok, INTER)
            bg_next = _bt_tile(storage_ptr, homes_g, r, rank_g, n0, n0ok)
            bu_next = _bt_tile(storage_ptr, homes_u, r, rank_u, n0, n0ok)
            for ni in range(N_ITERS):
                n = n0 + ni * BLOCK_N
                nmask = n < INTER
                g, u, bg, bu = g_next, u_next, bg_next, bu_next
                nn = n + BLOCK_N
                nn_ok = (nn < INTER) & (ni + 1 < N_ITERS)
                g_next, u_next = _load_gate_up(yrow, nn, mmask, nn_ok, INTER)
                bg_next = _bt_tile(storage_ptr, homes_g, r, rank_g, nn, nn_ok)
                bu_next = _bt_tile(storage_ptr, homes_u, r, rank_u, nn, nn_ok)
                g += scale_g * _delta(
                    zg, bg, storage_ptr, z_ptr, table_g, rows, mmask, 0, n, nmask, rank_g,
                    T, R_MAX, eff, BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
                )  # fmt: skip
                u += scale_u * _delta(
                    zu, bu, storage_ptr, z_ptr, table_u, rows, mmask, 1, n, nmask, rank_u,
                    T, R_MAX, eff, BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
                )  # fmt: skip
                _silu_mul_store(g, u, out_ptr, rows, mmask, n, nmask, stride_om)
        else:
            for ni in range(N_ITERS):
                n = n0 + ni * BLOCK_N
                nmask = n < INTER
                g, u = _load_gate_up(yrow, n, mmask, nmask, INTER)
                g += scale_g * _delta(
                    zg, _bt_tile(storage_ptr, homes_g, r, rank_g, n, nmask), storage_ptr,
                    z_ptr, table_g, rows, mmask, 0, n, nmask, rank_g, T, R_MAX, eff,
                    BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
                )  # fmt: skip
                u += scale_u * _delta(
                    zu, _bt_tile(storage_ptr, homes_u, r, rank_u, n, nmask), storage_ptr,
                    z_ptr, table_u, rows, mmask, 1, n, nmask, rank_u, T, R_MAX, eff,
                    BLOCK_M, BLOCK_R, ALIGN, UPCAST, PREC,
                )  # fmt: skip
                _silu_mul_store(g, u, out_ptr, rows, mmask, n, nmask, stride_om)


def grid_rows(num_rows: int, num_slots: int, block_m: int) -> int:
    """Static bound of axis 0: the slot tiles (``ops.max_tiles``) + the ``-1`` run's."""
    return 2 * cdiv(num_rows, block_m) + min(num_slots, num_rows)
