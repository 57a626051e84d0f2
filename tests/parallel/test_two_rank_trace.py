"""An exact two-rank LoRA trace, run on two real gloo processes in FP16.

The worked example fixes the intermediates (Z1,j, Z1, D1, P2,j, Z2, D2, Y) of a
column-parallel projection followed by a row-parallel one; the inputs below were solved by
hand to produce them (all dyadic, so exact in FP16), and `test_inputs_reproduce_the_trace`
re-derives every intermediate from them with Fractions, independently of the code under
test. Orientation: S-LoRA's (``X A B``): A1 ``[h, r]``, B1 ``[r, d]``, A2 ``[d, r]``,
B2 ``[r, h]``, W2 ``[d, h]``.

What each rank j of the one TP layout computes, checked exactly (no LoRA collective):

    column stage  A1 whole: the full bottleneck Z1 = X A1 (Z1,j, the rank slices of Z1's
                  columns, are what a rank-sharded A would give; no rank computes them
                  alone), then its output columns: X W1_j + Z1 B1_j, LoRA delta D1_j
                  = D1[:, 2j:2j+2] (also as three fused q/k/v slices);
    row stage     A2's rows j: the partial bottleneck P2,j = H_j A2_j (summed it would be
                  Z2 = H A2, but nothing sums it), expanded by the whole B2: the rank's
                  pre-reduce output H_j W2_j + P2,j B2, whose LoRA part P2,j B2 sums over
                  the ranks to D2 = Z2 B2;
    output        Y = sum_j (H_j W2_j + P2,j B2) after the one base all-reduce, on both
                  ranks.
"""

from __future__ import annotations

from fractions import Fraction as Fr
from typing import Any

import pytest

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
TRACE_P2 = (TRACE_P2_0, TRACE_P2_1)


def mm(a: list[list[Any]], b: list[list[Any]]) -> list[list[Fr]]:
    return [[sum((Fr(a[i][k]) * Fr(b[k][j]) for k in range(len(b))), Fr(0))
             for j in range(len(b[0]))] for i in range(len(a))]


def cols(m: list[list[Any]], lo: int, hi: int) -> list[list[Any]]:
    return [row[lo:hi] for row in m]


def add(a: list[list[Any]], b: list[list[Any]]) -> list[list[Fr]]:
    return [[Fr(x) + Fr(y) for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b,
                                                                                   strict=True)]


def sub(a: list[list[Any]], b: list[list[Any]]) -> list[list[Fr]]:
    return add(a, [[-Fr(y) for y in row] for row in b])


def transpose(m: list[list[Any]]) -> list[list[Any]]:
    return [list(c) for c in zip(*m, strict=True)]


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
    # the schedule's identities: D1 column slices from the whole Z1; rank partials P2,j B2
    # (and the base partials H_j W2_j) sum to D2 (and Y)
    for j in range(2):
        assert mm(TRACE_Z1, cols(B1, 2 * j, 2 * j + 2)) == cols(TRACE_D1, 2 * j, 2 * j + 2)
    assert add(mm(TRACE_P2_0, B2), mm(TRACE_P2_1, B2)) == TRACE_D2
    base = add(mm(cols(H, 0, 2), W2[:2]), mm(cols(H, 2, 4), W2[2:]))
    assert add(base, TRACE_D2) == TRACE_Y


def test_column_stage_computes_whole_z1_and_its_d1_slice(ranks: list[dict[str, Any]]
                                                         ) -> None:
    base = mm(X, transpose(W1))
    for j in range(2):
        r, lo, hi = ranks[j], 2 * j, 2 * j + 2
        assert as_fr(r["col_z"]) == TRACE_Z1  # A1 whole: every rank the full bottleneck
        assert as_fr(r["col_base"]) == cols(base, lo, hi)
        assert sub(as_fr(r["col_output"]), as_fr(r["col_base"])) == cols(TRACE_D1, lo, hi)
        assert as_fr(r["col_output"]) == cols(add(base, TRACE_D1), lo, hi)
        # fused q/k/v slices of the same factors: each slice its own Z1 and D1_j
        for k in range(3):
            assert as_fr(r["qkv_z"][:, k, :]) == TRACE_Z1
            assert as_fr(r["qkv_output"][:, 2 * k:2 * k + 2]) == as_fr(r["col_output"])
    d1 = [r0 + r1 for r0, r1 in zip(as_fr(ranks[0]["col_output"]),
                                    as_fr(ranks[1]["col_output"]), strict=True)]
    assert d1 == add(base, TRACE_D1)  # the two column slices are the global output


def test_row_stage_expands_rank_partials_with_whole_b2(ranks: list[dict[str, Any]]
                                                       ) -> None:
    lora_parts = []
    for j in range(2):
        r, lo, hi = ranks[j], 2 * j, 2 * j + 2
        assert as_fr(r["row_z"]) == TRACE_P2[j]  # H_j A2_j: not summed into Z2
        assert as_fr(r["row_base_partial"]) == mm(cols(H, lo, hi), W2[lo:hi])
        lora = sub(as_fr(r["row_partial"]), as_fr(r["row_base_partial"]))
        assert lora == mm(TRACE_P2[j], B2)  # expanded by the whole B2, before any sum
        lora_parts.append(lora)
    assert add(*lora_parts) == TRACE_D2
    partials = add(as_fr(ranks[0]["row_partial"]), as_fr(ranks[1]["row_partial"]))
    assert partials == TRACE_Y


def test_output_after_one_all_reduce_on_both_ranks(ranks: list[dict[str, Any]]) -> None:
    for j in range(2):
        r = ranks[j]
        assert as_fr(r["y"]) == TRACE_Y
        assert as_fr(r["y_base"]) == mm(H, W2)
        assert sub(as_fr(r["y"]), as_fr(r["y_base"])) == TRACE_D2
        assert as_fr(r["col_output_2"]) == as_fr(r["col_output"])
        assert r["late_shrinks"] == 2


def test_communication_and_residency_ledgers(ranks: list[dict[str, Any]]) -> None:
    """The column then row stage: one base all-reduce of the FP16 [3, 4] output (24
    payload bytes, 2(N-1)/N of them on the ring), no LoRA call, the same bytes as the
    base alone; 48 resident bytes per rank (A1 and B2 whole: 8 + 4 + 4 + 8 scalars)."""
    for j in range(2):
        r = ranks[j]
        assert r["partials_counts"]["calls"] == 0  # column shards, unreduced row partial
        c = r["counts"]
        assert c["calls"] == c["base_calls"] == c["base_all_reduce"] == 1
        assert c["lora_calls"] == 0 and c["lora_ring_bytes"] == 0
        assert c["base_payload_bytes"] == 24 and c["base_ring_bytes"] == 24
        assert r["base_counts"] == c
        assert r["resident_bytes"] == 48
