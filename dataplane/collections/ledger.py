"""Parameter ledgers and break-even collection sizes, exact integers.

`S = d_in + d_out`, `r0` the source adapters' rank, `R` the shared rank, `n` adapters,
`k` clusters. These are representation counts for one adapted matrix shape; a model's
count sums them over every adapted module.
"""

from __future__ import annotations

from dataclasses import dataclass


def lora_params(n: int, r0: int, s: int) -> int:
    return n * r0 * s


def jd_full_params(n: int, rank: int, s: int) -> int:
    return rank * s + n * rank * rank


def jd_diag_params(n: int, rank: int, s: int) -> int:
    return rank * s + n * rank


def clustered_full_payload(k: int, n: int, rank: int, s: int) -> int:
    return k * rank * s + n * rank * rank


def clustered_full_paper(k: int, n: int, rank: int, s: int) -> int:
    """The paper's GPU ledger adds one cluster assignment per adapter."""
    return clustered_full_payload(k, n, rank, s) + n


def _least_n_above(numerator: int, denominator: int) -> int | None:
    """The least integer n >= 1 with n · denominator > numerator (None if none exists)."""
    if denominator <= 0:
        return None
    return max(1, numerator // denominator + 1)


def break_even_full(r0: int, rank: int, s: int) -> int | None:
    """Least n with n (r0 S − R²) > R S; None when JD-Full never saves parameters."""
    return _least_n_above(rank * s, r0 * s - rank * rank)


def break_even_diag(r0: int, rank: int, s: int) -> int | None:
    return _least_n_above(rank * s, r0 * s - rank)


@dataclass(frozen=True)
class ModuleLedger:
    """One module shape's counts for a fitted collection (what the job reports)."""

    d_out: int
    d_in: int
    n: int
    r0: int
    rank: int
    clusters: int
    method: str

    @property
    def s(self) -> int:
        return self.d_in + self.d_out

    @property
    def lora(self) -> int:
        return lora_params(self.n, self.r0, self.s)

    @property
    def joint(self) -> int:
        per_adapter = self.rank * self.rank if self.method == "jd-full" else self.rank
        return self.clusters * self.rank * self.s + self.n * per_adapter
