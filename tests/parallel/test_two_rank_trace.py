"""An exact two-rank LoRA trace, run on two real gloo processes in FP16.

The trace fixes the intermediates (Z1,j, Z1, D1, P2,j, Z2, D2, Y) of a column-parallel
projection followed by a row-parallel one; the inputs below were solved by hand to produce
them (all dyadic, so exact in FP16), and
`test_inputs_reproduce_the_trace` re-derives every intermediate from them with
Fractions, independently of the code under test. Orientation: S-LoRA's (``X A B``):
A1 ``[h, r]``, B1 ``[r, d]``, A2 ``[d, r]``, B2 ``[r, h]``, W2 ``[d, h]``.
"""

from __future__ import annotations

from fractions import Fraction as Fr
from typing import Any

import pytest

from dataplane.parallel import LAYOUT_LOCAL, LAYOUT_PAPER

from .dist_harness import run_world

X = [[0, 3, 0, 5], [4, 2, 0, -1], [3, 1, 1, 2]]
A1 = [[1, 0], [0, 1], [1, 1], [0, 0]]
B1 = [[1, 0, 2, -1], [2, 1, 0, 3]]
W1 = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 1, 0, 0]]  # base of projection 1 (PEFT)
H = [[5, 7, 7, 11], [-2, -3, 3, 4], [2, 2, -1, -3]]
A2 = [[1, -1], [0, 1], [1, 0], [-1, 1]]
B2 = [[1, 2, 0, -1], [0, 1, 3, 2]]
W2 = [[0.75, -7.5, -4.5, -11], [-0.75, 5.5, 3.5, 8], [0.75, 5.5, 5.5, 8],
      [-0.25, -3.5, -3.5, -5]]

# The expected intermediates and output (chosen first; the inputs above reproduce them).
TRACE_Z1_0, TRACE_Z1_1 = [[0], [4], [4]], [[3], [2], [2]]
TRACE_Z1 = [[0, 3], [4, 2], [4, 2]]
TRACE_D1 = [[6, 3, 0, 9], [8, 2, 8, 2], [8, 2, 8, 2]]
TRACE_P2_0 = [[5, 2], [-2, -1], [2, 0]]
TRACE_P2_1 = [[-4, 11], [-1, 4], [2, -3]]
TRACE_Z2 = [[1, 13], [-3, 3], [4, -3]]
TRACE_D2 = [[1, 15, 39, 25], [-3, -3, 9, 9], [4, 5, -9, -10]]
TRACE_Y = [[2, 16, 41, 27], [-1, -2, 10, 11], [4, 6, -6, -9]]


def mm(a: list[list[Any]], b: list[list[Any]]) -> list[list[Fr]]:
    return [[sum((Fr(a[i][k]) * Fr(b[k][j]) for k in range(len(b))), Fr(0))
             for j in range(len(b[0]))] for i in range(len(a))]


def cols(m: list[list[Any]], lo: int, hi: int) -> list[list[Any]]:
    return [row[lo:hi] for row in m]


def add(a: list[list[Any]], b: list[list[Any]]) -> list[list[Fr]]:
    return [[Fr(x) + Fr(y) for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b,
                                                                                   strict=True)]


def as_fr(t: Any) -> list[list[Fr]]:
    return [[Fr(float(v)) for v in row] for row in t.double().tolist()]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    payload = {"X": X, "A1": A1, "B1": B1, "W1": W1, "H": H, "A2": A2, "B2": B2, "W2": W2}
    return run_world("tests.parallel.scenarios_two_rank_trace:run", payload)


def test_inputs_reproduce_the_trace() -> None:
    z1 = mm(X, A1)
    assert cols(z1, 0, 1) == TRACE_Z1_0 and cols(z1, 1, 2) == TRACE_Z1_1 and z1 == TRACE_Z1
    assert mm(z1, B1) == TRACE_D1
    assert mm(cols(H, 0, 2), A2[:2]) == TRACE_P2_0
    assert mm(cols(H, 2, 4), A2[2:]) == TRACE_P2_1
    assert mm(H, A2) == TRACE_Z2
    assert mm(mm(H, A2), B2) == TRACE_D2
    assert add(mm(H, W2), TRACE_D2) == TRACE_Y


def test_first_projection_gathers_rank_slices(ranks: list[dict[str, Any]]) -> None:
    for j, want_z1j in enumerate((TRACE_Z1_0, TRACE_Z1_1)):
        tr = ranks[j][LAYOUT_PAPER]["col"]
        assert as_fr(tr["bottleneck_local"][:, 0, :]) == want_z1j
        assert as_fr(tr["bottleneck"][:, 0, :]) == TRACE_Z1
    d1 = [r0 + r1 for r0, r1 in zip(as_fr(ranks[0][LAYOUT_PAPER]["col"]["delta"]),
                                    as_fr(ranks[1][LAYOUT_PAPER]["col"]["delta"]), strict=True)]
    assert d1 == TRACE_D1
    for layout in (LAYOUT_PAPER, LAYOUT_LOCAL):  # base + adapter, column-sharded
        out = [r0 + r1 for r0, r1 in zip(as_fr(ranks[0][layout]["col"]["output"]),
                                         as_fr(ranks[1][layout]["col"]["output"]), strict=True)]
        w1_t = [list(c) for c in zip(*W1, strict=True)]
        assert out == add(mm(X, w1_t), TRACE_D1)


def test_second_projection_reduces_partials_and_fuses_slices(ranks: list[dict[str, Any]]
                                                             ) -> None:
    for j, want_p2j in enumerate((TRACE_P2_0, TRACE_P2_1)):
        tr = ranks[j][LAYOUT_PAPER]["row"]
        assert as_fr(tr["bottleneck_partial"][:, 0, :]) == want_p2j
        assert as_fr(tr["bottleneck"][:, 0, :]) == TRACE_Z2
        assert as_fr(tr["delta"]) == cols(TRACE_D2, 2 * j, 2 * j + 2)  # E_j(D2,j)
    for layout in (LAYOUT_PAPER, LAYOUT_LOCAL):
        for j in range(2):
            assert as_fr(ranks[j][layout]["row"]["output"]) == TRACE_Y


def test_communication_and_residency_ledgers(ranks: list[dict[str, Any]]) -> None:
    """Ring ledgers: 3 elements per gather, 6 per rank-width reduce, 12 for the base reduce;
    with Q/K/V, 30 FP16 LoRA payload bytes vs 24 base; 32 resident bytes per rank."""
    for j in range(2):
        paper, local = ranks[j][LAYOUT_PAPER], ranks[j][LAYOUT_LOCAL]
        assert paper["first"]["lora_calls"] == 2
        assert paper["first"]["lora_ring_bytes"] == 2 * (3 + 6)
        assert paper["first"]["base_ring_bytes"] == 24
        assert paper["qkv_lora_calls"] == 2  # q/k/v bottlenecks share one all-gather
        assert paper["qkv_lora_ring_bytes"] == 30
        assert paper["qkv_base_ring_bytes"] == 24
        assert paper["resident_bytes"] == 32
        assert local["first"]["lora_calls"] == 0 and local["qkv_lora_calls"] == 0
        assert local["first"]["calls"] == 1  # the base all-reduce only
        assert local["resident_bytes"] == 48  # A1 and B2 replicated: 8 + 4 + 4 + 8 scalars
