"""The launchers' host integer helpers agree with Triton's own (its constexpr functions
cost µs per host call, so the launchers do not use them)."""

from __future__ import annotations

import triton

from dataplane.intmath import cdiv, next_pow2


def test_cdiv_matches_triton() -> None:
    for a in range(0, 600, 7):
        for b in range(1, 70):
            assert cdiv(a, b) == triton.cdiv(a, b)


def test_next_pow2_matches_triton() -> None:
    for n in [*range(0, 1100), 4095, 4096, 4097, 1 << 20, (1 << 20) + 1]:
        assert next_pow2(n) == triton.next_power_of_2(n)
