"""Compress-then-Serve worked examples as exact test vectors (Fraction references).

Three rank-2 adapters share one 3 x 2 basis (U = V); their cores fit it exactly under
JD-Full, while JD-Diag cannot be exact. The same fixture checks the runtime operator and
the parameter ledgers and break-even sizes.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from dataplane.collections import JD_DIAG, FactoredDelta, fit_collection, fit_jd_diag, fit_jd_full
from dataplane.collections.joint_fit import residual_sq
from dataplane.collections.ledger import (
    break_even_diag,
    break_even_full,
    jd_diag_params,
    jd_full_params,
    lora_params,
)
from dataplane.collections.operator import joint_delta

Matrix = list[list[Fraction]]

BASIS = [[1, 0], [0, 1], [0, 0]]  # U = V, 3 x 2
CORES = {"a": [[1, 0], [0, 2]], "b": [[0, 3], [4, 0]], "c": [[2, -1], [1, 1]]}


def _mul(x: Matrix, y: Matrix) -> Matrix:
    return [[sum((x[i][k] * y[k][j] for k in range(len(y))), Fraction(0))
             for j in range(len(y[0]))] for i in range(len(x))]


def _t(x: Matrix) -> Matrix:
    return [list(col) for col in zip(*x, strict=True)]


def _frac(x: list[list[int]]) -> Matrix:
    return [[Fraction(v) for v in row] for row in x]


def _exact_delta(name: str) -> Matrix:
    u = _frac(BASIS)
    return _mul(_mul(u, _frac(CORES[name])), _t(u))


def _rank(rows: Matrix) -> int:
    """Exact rank by Gaussian elimination over the rationals."""
    m = [list(r) for r in rows]
    rank, col = 0, 0
    while rank < len(m) and col < len(m[0]):
        pivot = next((r for r in range(rank, len(m)) if m[r][col] != 0), None)
        if pivot is None:
            col += 1
            continue
        m[rank], m[pivot] = m[pivot], m[rank]
        for r in range(len(m)):
            if r != rank and m[r][col] != 0:
                f = m[r][col] / m[rank][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[rank], strict=True)]
        rank, col = rank + 1, col + 1
    return rank


def _factored(name: str) -> FactoredDelta:
    u = torch.tensor(BASIS, dtype=torch.float64)
    core = torch.tensor(CORES[name], dtype=torch.float64)
    return FactoredDelta.of(u @ core, u.T)


def _tensor(x: Matrix) -> torch.Tensor:
    return torch.tensor([[float(v) for v in row] for row in x], dtype=torch.float64)


def test_updates_are_linearly_independent() -> None:
    vecs = [[v for row in _exact_delta(n) for v in row] for n in "abc"]
    assert _rank(vecs) == 3


def test_jd_full_reconstructs_the_fixture_exactly() -> None:
    deltas = [_factored(n) for n in "abc"]
    fit = fit_jd_full(deltas, 2)
    for i, name in enumerate("abc"):
        recon = fit.u @ fit.core(i) @ fit.v.T
        assert torch.allclose(recon, _tensor(_exact_delta(name)), atol=1e-12, rtol=0)
        assert fit.residual_sq(deltas[i], i) < 1e-12 * deltas[i].frobenius_sq()


def test_dropping_off_diagonal_cores_leaves_the_witness_27() -> None:
    u = _frac(BASIS)
    exact = Fraction(0)
    for name in "abc":
        core = _frac(CORES[name])
        diag = [[core[0][0], Fraction(0)], [Fraction(0), core[1][1]]]
        residual = _exact_delta(name)
        recon = _mul(_mul(u, diag), _t(u))
        exact += sum((a - b) ** 2 for ra, rb in zip(residual, recon, strict=True)
                     for a, b in zip(ra, rb, strict=True))
    assert exact == 27
    ut = torch.tensor(BASIS, dtype=torch.float64)
    ours = sum(residual_sq(_factored(n), ut, ut, torch.diag(torch.diagonal(
        torch.tensor(CORES[n], dtype=torch.float64)))) for n in "abc")
    assert ours == pytest.approx(27.0, abs=1e-12)


def test_jd_diag_cannot_be_exact_and_never_beats_the_span_bound() -> None:
    deltas = [_factored(n) for n in "abc"]
    fit = fit_jd_diag(deltas, 2, iterations=200)
    total = sum(fit.residuals_sq(deltas))
    stacked = torch.stack([_tensor(_exact_delta(n)).reshape(-1) for n in "abc"], dim=1)
    # Any rank-2 JD-Diag lies in a 2-dim span of atoms: error >= the 3rd singular value².
    bound = float(torch.linalg.svdvals(stacked)[2] ** 2)
    assert bound > 0.1
    assert total >= bound - 1e-9
    assert total <= 27.0 + 1e-9
    steps = fit.objective
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(steps))


def test_runtime_operator_matches_the_worked_example() -> None:
    x = torch.tensor([[1, 2, 3], [0, -1, 2]], dtype=torch.float64)
    u = torch.tensor(BASIS, dtype=torch.float64)
    assert torch.equal(x @ u, torch.tensor([[1.0, 2.0], [0.0, -1.0]], dtype=torch.float64))
    cores = torch.stack([torch.tensor(CORES[n], dtype=torch.float64) for n in "abc"])
    out = joint_delta(x, torch.tensor([1, 1]), torch.zeros(3, dtype=torch.long),
                      u.unsqueeze(0), cores, u.unsqueeze(0))
    expected = _mul(_frac([[1, 2, 3], [0, -1, 2]]), _t(_exact_delta("b")))
    assert expected == _frac([[6, 4, 0], [-3, 0, 0]])
    assert torch.equal(out, _tensor(expected))


def test_parameter_ledgers_and_break_even() -> None:
    assert (lora_params(3, 2, 6), jd_full_params(3, 2, 6), jd_diag_params(3, 2, 6)) == \
        (36, 24, 18)
    assert break_even_full(2, 2, 6) == 2 and break_even_diag(2, 2, 6) == 2
    s = 4096 + 4096
    assert lora_params(1000, 16, s) == 131_072_000
    assert jd_full_params(1000, 32, s) == 1_286_144
    assert jd_diag_params(1000, 32, s) == 294_144
    assert break_even_full(1, 4, 4) is None  # r0 S - R² = 4 - 16 <= 0: never smaller


def test_fit_collection_diag_on_fixture_reports_residuals() -> None:
    fit = fit_collection({"m": [_factored(n) for n in "abc"]}, method=JD_DIAG, rank=2)
    assert fit.assignment == (0, 0, 0)
    assert sum(r["m"] for r in fit.residual_sq) > 0.1
