"""Row-weighted K splits of the two-kernel path (``ShrinkConfig.row_split``): slots whose
tiles carry more rows get more splits; the expand (and the gate/up expand folded into
SiLU·mul) sums exactly the partials the shrink wrote. Against float64, through the
Triton interpreter on CPU (CUDA when present)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.reference import lora_delta_reference

from .lora_cases import TOLERANCE, check_case, enable_folded_silu, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def row_split(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every shrink entry with ``row_split = 4``; returns the splits each shrink launch
    could use (recorded from its plan), so a test can check the path ran."""
    from dataplane.kernels.triton import configs, ops

    for key, cfg in list(configs.SHRINK_TABLE.items()):
        monkeypatch.setitem(configs.SHRINK_TABLE, key, dataclasses.replace(
            cfg, block_m=16, row_split=4))
    seen: list[tuple[int, ...]] = []
    real = ops._shrink_plan

    def spy(cfg: configs.ShrinkConfig, *args: object) -> object:
        seen.append((cfg.row_split, cfg.split_k))
        return real(cfg, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "_shrink_plan", spy)
    return seen


@pytest.mark.parametrize("out_features", [(48,), (48, 16, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_split_add_lora_matches_reference(
    row_split: list[tuple[int, ...]], out_features: tuple[int, ...], dtype: torch.dtype
) -> None:
    from dataplane.kernels.triton.backend import TritonLoraBackend

    # "skewed": one slot with most rows (full tiles: most splits) beside one-row slots
    case = make_case(dtype=dtype, in_features=200, out_features=out_features,
                     ranks=[4, 16, 9], num_rows=90, dist="skewed", none_share=0.1, seed=7,
                     device=DEVICE)  # fmt: skip
    check_case(case, TritonLoraBackend(fused=False))
    assert row_split and all(r == 4 and s > 1 for r, s in row_split)


def test_row_split_folded_silu_matches_reference(
    row_split: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataplane.kernels.triton.backend import TritonLoraBackend

    enable_folded_silu(monkeypatch)
    case = make_case(dtype=torch.float32, in_features=200, out_features=(40, 40),
                     ranks=[8, 16], num_rows=90, dist="skewed", none_share=0.1, seed=9,
                     device=DEVICE)  # fmt: skip
    backend = TritonLoraBackend(fused=False)
    meta = backend.build_meta(
        torch.tensor(case.row_slot, dtype=torch.int32, device=DEVICE),
        LoraMetaBuffers(len(case.row_slot), case.table.num_slots, DEVICE))
    w = case.table.weights
    ws = LoraWorkspace(backend.workspace_numel(90, 2, w.max_rank), DEVICE)
    act = backend.add_lora_silu_mul(case.y0.clone(), case.x, meta, w, ws)
    assert act is not None
    y = case.y0.double().cpu() + lora_delta_reference(case.x, case.row_slot, case.factors,
                                                      case.out_features)
    ref = F.silu(y[:, :40]) * y[:, 40:]
    err = float((act.double().cpu() - ref).norm() / ref.norm())
    assert err < TOLERANCE[torch.float32], err
    assert row_split
