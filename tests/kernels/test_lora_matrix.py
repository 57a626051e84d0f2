"""Punica-style matrix against the float64 reference, every CPU backend.

Axes: dtype × adapter distribution × share of no-adapter rows (full product),
with hidden sizes (incl. non-multiples of the 128-wide K tile and of 16), mixed
rank sets (1…128) and row counts rotating across the product so each value of
each axis is covered while the interpreter stays within the test budget.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dataplane.kernels import LoraBackend

from .lora_cases import DISTRIBUTIONS, check_case, make_case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NONE_SHARES = (0.0, 0.3)
HIDDEN = (40, 136, 37, 72)  # 37: no 16-byte alignment (addr_align 1)
RANK_SETS = ([1, 3, 8, 16], [16], [5, 33, 64, 128], [2, 128, 7])
ROWS = (1, 9, 24, 13, 4)

CASES = list(itertools.product(DTYPES, DISTRIBUTIONS, NONE_SHARES))


def two_kernel_variant(backend: LoraBackend, i: int) -> LoraBackend:
    """Odd cases run Triton's two-kernel path (shrink + expand), even ones the
    fused decode launch it picks by default at these sizes."""
    if backend.name == "triton" and i % 2:
        from dataplane.kernels.triton.backend import TritonLoraBackend

        return TritonLoraBackend(fused=False)
    return backend


@pytest.mark.parametrize(("dtype", "dist", "none_share"), CASES)
def test_single_slice_matches_reference(
    cpu_backend: LoraBackend, dtype: torch.dtype, dist: str, none_share: float
) -> None:
    i = CASES.index((dtype, dist, none_share))
    case = make_case(
        dtype=dtype,
        in_features=HIDDEN[i % len(HIDDEN)],
        out_features=(HIDDEN[(i + 1) % len(HIDDEN)],),
        ranks=RANK_SETS[i % len(RANK_SETS)],
        num_rows=ROWS[i % len(ROWS)],
        dist=dist,
        none_share=none_share,
        seed=i,
        layout=("scattered", "stacked")[i % 4 // 2],
    )
    check_case(case, two_kernel_variant(cpu_backend, i))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("out_features", "absent_every"),
    [((48, 16, 16), 3), ((40, 40), 2), ((144, 24, 24), 0)],  # GQA q/k/v; gate/up
)
def test_multi_slice_shares_one_shrink(
    cpu_backend: LoraBackend,
    dtype: torch.dtype,
    out_features: tuple[int, ...],
    absent_every: int,
) -> None:
    case = make_case(
        dtype=dtype,
        in_features=40,
        out_features=out_features,
        ranks=[4, 16, 9],
        num_rows=11,
        dist="uniform",
        none_share=0.2,
        seed=len(out_features) * 7 + absent_every,
        absent_every=absent_every,
    )
    check_case(case, two_kernel_variant(cpu_backend, DTYPES.index(dtype) + len(out_features)))


def test_rank_above_one_rank_chunk_and_many_slots(cpu_backend: LoraBackend) -> None:
    """Rank 128 spans several BLOCK_R chunks; 20 slots exercise the tile map."""
    case = make_case(
        dtype=torch.float32,
        in_features=24,
        out_features=(20,),
        ranks=[128, 1, 65, 2],
        num_rows=20,
        dist="distinct",
        none_share=0.1,
        seed=99,
    )
    check_case(case, cpu_backend)
    check_case(case, two_kernel_variant(cpu_backend, 1))


@pytest.mark.parametrize("num_rows", [1, 6])
def test_split_k_partials_sum_to_the_full_product(cpu_backend: LoraBackend, num_rows: int) -> None:
    """K = 1000 spans 8 K tiles: the device picks several split-K partials
    (more for fewer live row tiles), and expand must sum exactly those."""
    case = make_case(
        dtype=torch.float32,
        in_features=1000,
        out_features=(24,),
        ranks=[16, 3],
        num_rows=num_rows,
        dist="distinct",
        none_share=0.0,
        seed=5 + num_rows,
    )
    check_case(case, two_kernel_variant(cpu_backend, 1))  # split-K lives in the two-kernel path
