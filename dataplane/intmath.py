"""Host-side integer helpers for kernel launchers (grids, padded sizes).

Plain Python on purpose: ``triton.cdiv`` / ``triton.next_power_of_2`` are constexpr
functions in recent Triton, several µs per call from the host, and an eager 8B step's
launchers call them hundreds of times.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` for ``n >= 1``; 0 for 0 (as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 1 else max(n, 0)
