"""The merge arithmetic on exact test vectors: the old/new adapter trace (live and merged
operators agree exactly), binary16 2048 + 1 (why a release never unmerges), and order in
bf16 (float32 accumulate, one rounding)."""

from __future__ import annotations

from fractions import Fraction

import torch

from controlplane.merges.compute import Delta, merge_weight

Matrix = list[list[Fraction]]

W = [[2, -1, 0], [1, 3, -2]]
# old adapter: rank 2, s = 1/2; B_o A_o = 2 Δ_o = [[1, 4, 1], [-1, 2, 2]]
A_OLD, B_OLD, S_OLD = [[2, 2, -1], [-1, 2, 2]], [[1, 1], [0, 1]], Fraction(1, 2)
DELTA_OLD = [[Fraction(1, 2), 2, Fraction(1, 2)], [Fraction(-1, 2), 1, 1]]
X_OLD, Y_OLD = [1, 2, -1], [4, Fraction(19, 2)]
# new adapter: logical rank 1 in a physical rank-2 slot (second row of A, column of B zero)
A_NEW, B_NEW, S_NEW = [[2, -1, 0], [0, 0, 0]], [[1, 0], [3, 0]], Fraction(1, 4)
DELTA_NEW = [[Fraction(1, 2), Fraction(-1, 4), 0], [Fraction(3, 2), Fraction(-3, 4), 0]]
X_NEW, Y_NEW = [2, 0, 1], [5, 3]


def _fr(m: list[list[int]] | Matrix) -> Matrix:
    return [[Fraction(v) for v in row] for row in m]


def _matmul(a: Matrix, b: Matrix) -> Matrix:
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0))
             for j in range(len(b[0]))] for i in range(len(a))]


def _apply(m: Matrix, x: list[int]) -> list[Fraction]:
    return [sum((row[j] * x[j] for j in range(len(x))), Fraction(0)) for row in m]


def _tensor(m: list[list[int]]) -> torch.Tensor:
    return torch.tensor(m, dtype=torch.float32)


def _exact(t: torch.Tensor) -> Matrix:
    return [[Fraction(float(v)) for v in row] for row in t.tolist()]


def test_old_adapter_live_and_merged_agree_exactly() -> None:
    delta = [[S_OLD * v for v in row] for row in _matmul(_fr(B_OLD), _fr(A_OLD))]
    assert delta == _fr(DELTA_OLD)
    merged = merge_weight(_tensor(W), [Delta(_tensor(A_OLD), _tensor(B_OLD), float(S_OLD))],
                          torch.float32)
    assert _exact(merged) == [[w + d for w, d in zip(wr, dr, strict=True)]
                              for wr, dr in zip(_fr(W), delta, strict=True)]
    live = [y + S_OLD * z for y, z in zip(
        _apply(_fr(W), X_OLD), _apply(_fr(B_OLD), [int(v) for v in _apply(_fr(A_OLD), X_OLD)]),
        strict=True)]
    assert live == Y_OLD
    assert _apply(_exact(merged), X_OLD) == Y_OLD


def test_new_adapter_padded_rank_equals_logical_rank() -> None:
    padded = merge_weight(_tensor(W), [Delta(_tensor(A_NEW), _tensor(B_NEW), float(S_NEW))],
                          torch.float32)
    logical = merge_weight(_tensor(W), [Delta(_tensor(A_NEW[:1]),
                                              _tensor([[r[0]] for r in B_NEW]),
                                              float(S_NEW))], torch.float32)
    assert torch.equal(padded, logical)
    assert _exact(padded) == [[w + d for w, d in zip(wr, dr, strict=True)]
                              for wr, dr in zip(_fr(W), _fr(DELTA_NEW), strict=True)]
    assert _apply(_exact(padded), X_NEW) == Y_NEW


def test_binary16_merge_then_unmerge_is_not_the_base() -> None:
    base = torch.tensor([[2048.0]], dtype=torch.float16)
    one = Delta(torch.ones(1, 1), torch.ones(1, 1), 1.0)
    merged = merge_weight(base, [one], torch.float16)
    assert merged.item() == 2048.0  # 2049 is a tie between 2048 and 2050: to even
    unmerged = merged - torch.tensor([[1.0]], dtype=torch.float16)
    assert unmerged.item() == 2047.0 and torch.isfinite(unmerged).all()
    assert unmerged.item() != base.item()  # finite, and still not the clean base
    # a release is always computed from the clean base, so the base is never lost
    assert merge_weight(base, [], torch.float16).item() == 2048.0
    assert merge_weight(base, [one], torch.float32).item() == 2049.0


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 values around each element (8 significant bits)."""
    _, exponent = torch.frexp(t.to(torch.float32))
    return torch.ldexp(torch.ones_like(t, dtype=torch.float32), exponent - 8)


def test_two_adapters_in_either_order_differ_by_at_most_one_bf16_rounding() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g)
    first = Delta(torch.randn(4, 96, generator=g), torch.randn(64, 4, generator=g), 0.37)
    second = Delta(torch.randn(8, 96, generator=g), torch.randn(64, 8, generator=g), 1.9)
    forward = merge_weight(w, [first, second], torch.bfloat16)
    reverse = merge_weight(w, [second, first], torch.bfloat16)
    exact = (w.double() + first.scale * (first.b.double() @ first.a.double())
             + second.scale * (second.b.double() @ second.a.double()))
    fp32_forward = merge_weight(w, [first, second], torch.float32)
    fp32_reverse = merge_weight(w, [second, first], torch.float32)
    assert not torch.equal(fp32_forward, fp32_reverse)  # the order is visible in float32
    # one rounding of a float32 sum: each result is within one bf16 spacing of the exact
    # value, and the two orders within one spacing of each other
    for result in (forward, reverse):
        assert bool(((result.double() - exact).abs() <= _bf16_ulp(result).double()).all())
    gap = (forward.to(torch.float32) - reverse.to(torch.float32)).abs()
    assert bool((gap <= torch.maximum(_bf16_ulp(forward), _bf16_ulp(reverse))).all())
    assert torch.equal(forward, fp32_forward.to(torch.bfloat16))  # rounded once, at the end
