"""Expand column-loop variants (``ExpandConfig.n_iters`` > 1, ``y_prefetch``)
against the float64 reference.

Prefill configs use several column tiles per program and, per rank group, the
``y``-prefetching loop; the CPU matrix runs decode configs (one column tile),
so these cases install such configs for a small step's T class (the table is
looked up per launch) to run both loops through the interpreter, with slice
widths off the tile and ranks beyond one rank chunk.
"""

from __future__ import annotations

import pytest
import torch

from .lora_cases import check_case, make_case

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("y_prefetch", "dtype"),
    [(False, torch.float16), (True, torch.bfloat16)],
    ids=["bt-prefetch-fp16", "y-prefetch-bf16"],
)
def test_expand_column_loops_match_reference(
    monkeypatch: pytest.MonkeyPatch, y_prefetch: bool, dtype: torch.dtype
) -> None:
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend

    rows = 13
    t_key = configs.bucket(rows, configs.T_BUCKETS)
    cfg = configs.ExpandConfig(16, 16, 16, 4, 2, n_iters=3, y_prefetch=y_prefetch)
    for r_key in configs.R_BUCKETS:
        monkeypatch.setitem(configs.EXPAND_TABLE, (t_key, r_key), cfg)
    case = make_case(
        dtype=dtype,
        in_features=40,
        out_features=(72, 24),  # 72 = 1.5 spans of 3 x 16 columns; 24 < one span
        ranks=[5, 33, 16],  # 33: three rank chunks of 16
        num_rows=rows,
        dist="uniform",
        none_share=0.3,
        seed=11,
        device=TRITON_DEVICE,
        absent_every=3,
    )
    check_case(case, TritonLoraBackend(fused=False))


@pytest.mark.parametrize(
    ("pipe", "n_elems", "dtype"),
    [(0, 16 * 1024, torch.bfloat16), (3, 16 * 32, torch.float16), (4, 16 * 1024, torch.float32)],
    ids=["hand-prefetch-1024-bf16", "pipelined-32-fp16", "pipelined-1024-fp32"],
)
def test_fused_expand_loops_match_reference(
    monkeypatch: pytest.MonkeyPatch, pipe: int, n_elems: int, dtype: torch.dtype
) -> None:
    """The fused launch's expand loop, by hand and software-pipelined, with column
    tiles of 32 (several per slice share) and 1024 (wider than every slice)."""
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend

    rows = 11
    t_key = configs.bucket(rows, configs.T_BUCKETS)
    cfg = configs.FusedConfig(16, 32, 4, 4, 2, n_elems=n_elems, pipe=pipe)
    for shape in configs.FUSED_SHAPES:
        monkeypatch.setitem(configs.FUSED_TABLE, (t_key, shape), cfg)
    case = make_case(
        dtype=dtype,
        in_features=72,
        out_features=(200, 40, 40),  # 200 = 6.25 tiles of 32
        ranks=[3, 16, 9],
        num_rows=rows,
        dist="zipf1.5",
        none_share=0.2,
        seed=17,
        device=TRITON_DEVICE,
    )
    check_case(case, TritonLoraBackend(fused=True))
