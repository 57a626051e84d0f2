# mypy: disable-error-code="no-untyped-def"
"""Probe: SiLU·mul with the folded LoRA expand over runs of rows that share an adapter.

Today's folded SiLU·mul (dataplane/ops/triton/silu_mul.py) runs one program per (row,
column block); each row reads its own adapter's ``B`` block, so rows sharing an adapter
read it again. Here the rows are sorted by fold slot and cut into runs of at most 16 rows
of one slot; one program per (run, column block) loads the run's ``B`` chunk once and
applies it to all its rows as one ``[16, RK] x [RK, BLOCK]`` tensor-core product.

One TP=2 rank of Llama-3-8B (gate/up 2 x 7,168 columns), 64 decode rows, rank 16, row t on
slot t mod n. Times both kernels alone in a CUDA graph (µs) and checks the outputs agree.

    python3 bench/lora_fold_group_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lora_timing import graph_time_us
from dataplane.ops import silu_and_mul
from dataplane.ops.lora_fold import FoldedExpand

DT = torch.bfloat16
ROWS, RANK, INTER = 64, 16, 7168
RUN = 16  # rows per run (tl.dot's smallest M)


@triton.jit
def _grouped_silu_mul(x_ptr, out_ptr, z_ptr, order_ptr, run_start_ptr, run_len_ptr,
                      run_slot_ptr, bg_ptr, bu_ptr, scale_ptr, stride_x, stride_o, stride_z,
                      inter, R: tl.constexpr, RK: tl.constexpr, G: tl.constexpr,
                      BLOCK: tl.constexpr):
    run = tl.program_id(0)
    n_rows = tl.load(run_len_ptr + run)
    if n_rows == 0:
        return
    start = tl.load(run_start_ptr + run)
    slot = tl.load(run_slot_ptr + run).to(tl.int64)
    g_idx = tl.arange(0, G)
    rmask = g_idx < n_rows
    rows = tl.load(order_ptr + start + g_idx, mask=rmask, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < inter
    m2 = rmask[:, None] & cmask[None, :]
    xr = x_ptr + rows[:, None] * stride_x + cols[None, :]
    g = tl.load(xr, mask=m2, other=0.0).to(tl.float32)
    u = tl.load(xr + inter, mask=m2, other=0.0).to(tl.float32)
    acc_g = tl.zeros((G, BLOCK), dtype=tl.float32)
    acc_u = tl.zeros((G, BLOCK), dtype=tl.float32)
    zrow = z_ptr + rows[:, None] * stride_z + slot * (2 * R)
    for i0 in tl.static_range(0, R, RK):
        ii = i0 + tl.arange(0, RK)
        zg = tl.load(zrow + ii[None, :], mask=rmask[:, None], other=0.0)
        zu = tl.load(zrow + R + ii[None, :], mask=rmask[:, None], other=0.0)
        boff = slot * (R * inter) + ii[:, None] * inter + cols[None, :]
        bg = tl.load(bg_ptr + boff, mask=cmask[None, :], other=0.0)
        bu = tl.load(bu_ptr + boff, mask=cmask[None, :], other=0.0)
        acc_g += tl.dot(zg, bg)
        acc_u += tl.dot(zu, bu)
    dt = x_ptr.dtype.element_ty
    g = (g + acc_g * tl.load(scale_ptr + slot * 2)).to(dt).to(tl.float32)
    u = (u + acc_u * tl.load(scale_ptr + slot * 2 + 1)).to(dt).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], y.to(dt), mask=m2)


def runs_of(row_slot: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(order, run starts, run lengths, run slots): rows sorted by slot, cut into runs of at
    most RUN rows of one slot; padded to len(row_slot) runs (length 0 = no work)."""
    order = sorted(range(len(row_slot)), key=row_slot.__getitem__)
    starts, lens, slots = [], [], []
    i = 0
    while i < len(order):
        s, j = row_slot[order[i]], i
        while j < len(order) and j - i < RUN and row_slot[order[j]] == s:
            j += 1
        starts.append(i)
        lens.append(j - i)
        slots.append(s)
        i = j
    pad = len(row_slot) - len(starts)
    return order, starts + [0] * pad, lens + [0] * pad, slots + [0] * pad


def measure(n: int, block: int, gen: torch.Generator) -> dict[str, float]:
    row_slot = [t % n for t in range(ROWS)]
    gate_up = torch.randn(ROWS, 2 * INTER, device="cuda", generator=gen).to(DT)
    tail = torch.randn(ROWS, n * 2 * RANK, device="cuda", generator=gen).to(DT)
    b = tuple(0.02 * torch.randn(n, RANK, INTER, device="cuda", generator=gen).to(DT)
              for _ in range(2))
    scale = torch.full((n, 2), 2.0, device="cuda")
    fold = FoldedExpand(torch.tensor(row_slot, dtype=torch.int32, device="cuda"), b, scale)
    order, starts, lens, rslots = (torch.tensor(v, dtype=torch.int32, device="cuda")
                                   for v in runs_of(row_slot))
    out = torch.empty(ROWS, INTER, device="cuda", dtype=DT)
    grid = (ROWS, triton.cdiv(INTER, block))

    def grouped() -> None:
        _grouped_silu_mul[grid](gate_up, out, tail, order, starts, lens, rslots, b[0], b[1],
                                scale, gate_up.stride(0), out.stride(0), tail.stride(0),
                                INTER, R=RANK, RK=16, G=RUN, BLOCK=block, num_warps=4)

    def today() -> None:
        silu_and_mul(gate_up, fold=fold, tail=tail)

    def plain() -> None:
        silu_and_mul(gate_up)

    want = silu_and_mul(gate_up, fold=fold, tail=tail)
    grouped()
    torch.cuda.synchronize()
    diff = (out.float() - want.float()).abs()
    return {"max_abs_diff": float(diff.max()), "mismatched_elements": int((diff > 0).sum()),
            "today_us": graph_time_us(today), "grouped_us": graph_time_us(grouped),
            "plain_us": graph_time_us(plain)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--slots", default="1,16,64")
    ap.add_argument("--blocks", default="64,128,256")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (int(s) for s in args.slots.split(",")):
        for block in (int(b) for b in args.blocks.split(",")):
            row = measure(n, block, gen)
            results[f"n={n} block={block}"] = row
            print(f"n={n} block={block}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()),
                  flush=True)
    with open(os.path.join(args.out, "lora_fold_group_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
