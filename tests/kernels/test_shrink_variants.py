"""Prefill shrink variants (``configs.PREFILL_SHRINK_CANDIDATES``) against the
float64 reference.

``bench/lora_kernels.py --tune`` installs each candidate for T = 4096 and
keeps the fastest, so every candidate must be correct. The CPU cases install
them for a small step's T class (the table is looked up per launch) and run
the Triton kernels through the interpreter: mixed ranks 1..128 (rank 128 =
two rank chunks of 64), rows with slot ``-1``, ``in_features`` off every
``BLOCK_K`` and slice widths off the expand tile. With ``per_sm`` the
device's split choice varies, so several candidates write (and the expand
sums) more than one K split. The GPU test runs every candidate at prefill
size on CUDA (bf16, where ``num_stages``, warps and the eviction hint matter);
with CUDA present the small cases run there too, like the other variant tests.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dataplane.kernels.reference import lora_delta_reference_grouped
from dataplane.kernels.triton import configs

from .lora_cases import TOLERANCE, check_case, make_case

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CANDS = configs.PREFILL_SHRINK_CANDIDATES
# Under the interpreter warps and stages do nothing: one case per distinct
# (block_m, block_k, split_k, per_sm), with the evict-first load where any
# candidate of that key has it (the plain load is what every other test runs).
_EVICT = {(c.block_m, c.block_k, c.split_k, c.per_sm) for c in CANDS if c.evict_x}
_CPU_KEYS = sorted(
    {(c.block_m, c.block_k, c.split_k, c.per_sm) for c in CANDS},
)


def _install(monkeypatch: pytest.MonkeyPatch, t_keys: tuple[int, ...], c: object) -> None:
    assert isinstance(c, configs.ShrinkConfig)
    for t_key in t_keys:
        for r_key in configs.R_BUCKETS:
            new = dataclasses.replace(c, block_r=min(c.block_r, r_key))
            monkeypatch.setitem(configs.SHRINK_TABLE, (t_key, r_key), new)


@pytest.mark.parametrize("key", _CPU_KEYS, ids=lambda k: "bm{}-bk{}-split{}-sm{}".format(*k))
def test_prefill_shrink_candidates_match_reference(
    monkeypatch: pytest.MonkeyPatch, key: tuple[int, int, int, int]
) -> None:
    from dataplane.kernels.triton.backend import TritonLoraBackend

    bm, bk, split, per_sm = key
    cfg = configs.ShrinkConfig(bm, 64, bk, split, 4, 3, per_sm, key in _EVICT)
    rows = 21
    _install(monkeypatch, (configs.bucket(rows, configs.T_BUCKETS),), cfg)
    case = make_case(
        dtype=torch.bfloat16 if bm % 32 else torch.float16,
        in_features=300,  # 4.7 x 64, 2.3 x 128, 1.2 x 256
        out_features=(56,),
        ranks=[1, 128, 7, 33],
        num_rows=rows,
        dist="zipf1.5",
        none_share=0.2,
        seed=bm + bk + per_sm,
        device=TRITON_DEVICE,
        absent_every=0,
    )
    check_case(case, TritonLoraBackend(fused=False))


def test_fit_shrink_smem_keeps_split_and_fits() -> None:
    """fp32 halves the budget of bf16 tiles: stages drop first, then BLOCK_K."""
    big = configs.ShrinkConfig(64, 64, 256, 8, 8, 3, 2)
    assert configs.fit_shrink_smem(big, 2) == big  # 2 x 128 x 256 x 2 = 131,072 bytes
    fp32 = configs.fit_shrink_smem(big, 4)  # 262,144 at 3 stages
    assert (fp32.num_stages, fp32.block_k, fp32.split_k) == (2, 256, 8)  # 1 buffer: 131,072
    deep = configs.ShrinkConfig(128, 64, 128, 16, 8, 5, 4)  # 4 x 192 x 128 x 4 = 393,216
    fit = configs.fit_shrink_smem(deep, 4)
    assert (fit.num_stages, fit.block_k, fit.split_k, fit.block_m) == (3, 128, 16, 128)  # 196,608
    for c in CANDS:
        for size in (2, 4):
            f = configs.fit_shrink_smem(c, size)
            assert max(1, f.num_stages - 1) * (f.block_m + f.block_r) * f.block_k * size <= 200_000


@pytest.mark.gpu
@pytest.mark.parametrize("cand", range(len(CANDS)))
def test_prefill_shrink_candidates_on_cuda(
    cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch, cand: int
) -> None:
    """Every candidate at T = 4096 on CUDA (bf16, mixed ranks 1..128, ``-1`` rows,
    widths off the tile), through the two-kernel path the prefill takes."""
    from dataplane.kernels.triton.backend import TritonLoraBackend

    c = CANDS[cand]
    _install(monkeypatch, (4096, 1 << 30), c)
    case = make_case(dtype=torch.bfloat16, in_features=4000, out_features=(4096, 1000),
                     ranks=[1, 128, 7, 33, 64, 16], num_rows=4096, dist="zipf1.5",
                     none_share=0.1, seed=cand, device=cuda_device)  # fmt: skip
    backend = TritonLoraBackend(fused=False)
    y = case.run(backend)
    again = case.run(backend)
    assert torch.equal(y, again)  # deterministic: split-K partials, no atomics
    ref = case.y0.double() + lora_delta_reference_grouped(
        case.x, case.row_slot, case.factors, case.out_features, cuda_device
    )
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < TOLERANCE[torch.bfloat16], (c, err)
    untouched = torch.tensor([s < 0 for s in case.row_slot], device=cuda_device)
    assert torch.equal(y[untouched], case.y0[untouched])
