"""The base projection with the LoRA expand in its epilogue (``linear_lora``) against
float64: ``x @ W^T`` plus every row's adapter delta, with mixed ranks, slices absent for
some adapters, rows without an adapter, several row tiles; and the plain projection.
Triton interpreter on CPU (CUDA when present)."""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.reference import lora_delta_reference
from dataplane.kernels.triton.backend import TritonLoraBackend
from dataplane.kernels.triton.linear_lora_ops import LinearLoraConfig, LinearScratch, linear_lora

from .lora_cases import TOLERANCE, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CFGS = [
    LinearLoraConfig(block_m=16, block_n=16, block_k=32, num_stages=2),
    LinearLoraConfig(block_m=32, block_n=16, block_k=16, num_stages=2, split_k=3),
]


def _weight(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    ("out_features", "ranks", "rows", "dist"),
    [
        ((48, 16, 16), [4, 16, 9], 40, "skewed"),  # q/k/v, 3 row tiles
        ((32, 32), [8, 1, 16], 21, "distinct"),  # gate/up, every row its own slot
        ((64,), [16, 2], 16, "identical"),  # one slot for every row
        ((48,), [32, 8, 24], 9, "uniform"),  # rank bucket 32
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", CFGS, ids=["one-split", "split-k-3"])
def test_linear_lora_matches_reference(
    out_features: tuple[int, ...], ranks: list[int], rows: int, dist: str, dtype: torch.dtype,
    cfg: LinearLoraConfig,
) -> None:
    case = make_case(dtype=dtype, in_features=72, out_features=out_features, ranks=ranks,
                     num_rows=rows, dist=dist, none_share=0.2, seed=5, device=DEVICE,
                     absent_every=3)  # fmt: skip
    backend = TritonLoraBackend(fused=False)
    w = case.table.weights
    meta = backend.build_meta(torch.tensor(case.row_slot, dtype=torch.int32, device=DEVICE),
                              LoraMetaBuffers(rows, w.num_slots, DEVICE))  # fmt: skip
    ws = LoraWorkspace(backend.workspace_numel(rows, w.num_slices, w.max_rank), DEVICE)
    weight = _weight(sum(out_features), 72, dtype, 1)
    y = torch.full_like(case.y0, float("nan"))  # written, never read
    scratch = LinearScratch.allocate(rows, sum(out_features), cfg, DEVICE)
    linear_lora(case.x, weight, y, cfg, scratch, meta, w, ws)
    assert int(scratch.counters.abs().sum()) == 0  # left at zero for the next launch
    base = case.x.double().cpu() @ weight.double().cpu().T
    ref = base + lora_delta_reference(case.x, case.row_slot, case.factors, out_features)
    got = y.double().cpu()
    assert torch.isfinite(got).all()
    err = float((got - ref).norm() / ref.norm())
    assert err < TOLERANCE[dtype], err
    # no adapter (row or slice): exactly the plain projection through the same kernel
    plain = torch.empty_like(y)
    linear_lora(case.x, weight, plain, cfg, scratch)
    offs = [sum(out_features[:k]) for k in range(len(out_features))]
    for t, s in enumerate(case.row_slot):
        for k, width in enumerate(out_features):
            if s < 0 or k not in case.factors[s]:
                cols = slice(offs[k], offs[k] + width)
                assert torch.equal(y[t, cols], plain[t, cols]), (t, s, k)


@pytest.mark.parametrize("cfg", CFGS, ids=["one-split", "split-k-3"])
def test_plain_projection_matches_reference(cfg: LinearLoraConfig) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(19, 70, generator=gen).to(DEVICE)
    weight = _weight(40, 70, torch.float32, 3)
    y = torch.empty(19, 40, device=DEVICE)
    linear_lora(x, weight, y, cfg, LinearScratch.allocate(19, 40, cfg, DEVICE))
    ref = x.double().cpu() @ weight.double().cpu().T
    assert float((y.double().cpu() - ref).abs().max()) < 1e-4


def test_refuses_slices_off_the_column_tile() -> None:
    case = make_case(dtype=torch.float32, in_features=32, out_features=(24, 8), ranks=[4],
                     num_rows=8, dist="uniform", none_share=0.0, seed=1, device=DEVICE)
    backend = TritonLoraBackend(fused=False)
    w = case.table.weights
    meta = backend.build_meta(torch.tensor(case.row_slot, dtype=torch.int32, device=DEVICE),
                              LoraMetaBuffers(8, w.num_slots, DEVICE))  # fmt: skip
    ws = LoraWorkspace(backend.workspace_numel(8, w.num_slices, w.max_rank), DEVICE)
    y = case.y0.clone()
    cfg = CFGS[0]
    with pytest.raises(LoraShapeError, match="multiple of block_n"):
        linear_lora(case.x, _weight(32, 32, torch.float32, 0), y, cfg,
                    LinearScratch.allocate(8, 32, cfg, DEVICE), meta, w, ws)
    assert torch.equal(y, case.y0)  # nothing written
