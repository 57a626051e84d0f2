"""Packed multi-slice shrink (``ShrinkConfig.pack``): one program computes every slice's
bottleneck of a q/k/v or gate/up module from one ``x`` stream. Mixed ranks, a slice
absent for some adapters, rows without an adapter; against float64 through the Triton
interpreter on CPU (CUDA when present), with the plain per-slice shrink's result
beside it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dataplane.kernels.triton import configs, ops

from .lora_cases import check_case, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every shrink entry with ``pack = 64``; returns what each shrink plan packed
    (slices per program, 0 = one program per slice)."""
    for key, cfg in list(configs.SHRINK_TABLE.items()):
        monkeypatch.setitem(configs.SHRINK_TABLE, key, dataclasses.replace(cfg, pack=64))
    seen: list[int] = []
    real = ops._shrink_plan

    def spy(cfg: configs.ShrinkConfig, s: int, k: int, ns: int, r_max: int,
            *args: object) -> object:  # fmt: skip
        seen.append(ops.shrink_pack(cfg, ns, r_max))
        return real(cfg, s, k, ns, r_max, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ops, "_shrink_plan", spy)
    return seen


@pytest.mark.parametrize(
    ("out_features", "ranks", "want"),
    [
        ((48, 16, 16), [4, 16, 9], 4),  # q/k/v: 3 slices -> 4 runs of 16 rank rows
        ((40, 40), [8, 16, 1], 2),  # gate/up
        ((48, 16, 16), [32, 8], 0),  # rank bucket 32: 4 x 32 > 64, per slice
        ((56,), [16], 0),  # one slice: nothing to pack
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_shrink_matches_reference(
    packed: list[int], out_features: tuple[int, ...], ranks: list[int], want: int,
    dtype: torch.dtype,
) -> None:  # fmt: skip
    from dataplane.kernels.triton.backend import TritonLoraBackend

    case = make_case(dtype=dtype, in_features=200, out_features=out_features, ranks=ranks,
                     num_rows=70, dist="skewed", none_share=0.1, seed=11, device=DEVICE,
                     absent_every=3)  # fmt: skip
    check_case(case, TritonLoraBackend(fused=False))
    assert packed and set(packed) == {want}


def test_pack_needs_every_rank_in_one_chunk() -> None:
    cfg = configs.ShrinkConfig(32, 16, 128, 8, 4, 3, pack=64)
    assert ops.shrink_pack(cfg, 3, 16) == 4
    assert ops.shrink_pack(cfg, 2, 16) == 2
    assert ops.shrink_pack(cfg, 3, 17) == 0  # rank over the chunk: a second chunk
    assert ops.shrink_pack(cfg, 1, 16) == 0
    assert ops.shrink_pack(dataclasses.replace(cfg, pack=0), 3, 16) == 0
    assert ops.shrink_pack(dataclasses.replace(cfg, block_r=32), 3, 32) == 0  # 128 > 64
