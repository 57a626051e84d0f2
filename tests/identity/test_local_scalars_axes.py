"""`LocalModuleLayout.local_scalars` counts by the *axis* each shard splits.

Fixture: the two-module rank-and-shard example — q_proj r2 A[2,8] B[8,2], v_proj r4
A[4,8] B[8,4], 2 bytes/scalar, TP=2. Expected values are derived by hand from the factor
shapes below (96 scalars / 192 bytes logical, 72 / 144 per rank, 288 bytes in all for
A replicated + B output-sharded), never from the code under test.

    layout (per rank, N=2)           q local            v local            sum
    column, A repl., B out-sharded   2*8 + 4*2 = 24     4*8 + 4*4 = 48     72
    column paper: A rank-sharded     1*8 + 4*2 = 16     2*8 + 4*4 = 32     48
    row: A input-sharded, B repl.    2*4 + 8*2 = 24     4*4 + 8*4 = 48     72
    row paper: A in-, B out-sharded  2*4 + 4*2 = 16     4*4 + 4*4 = 32     48
"""

from __future__ import annotations

import sys
from fractions import Fraction

import pytest

from dataplane.identity import (
    A_AXES,
    SCALING_ALPHA_OVER_R,
    SPLIT_INPUT,
    SPLIT_OUTPUT,
    IdentityError,
    LocalModuleLayout,
    ModuleSpec,
    ShardRange,
    residency_ledger,
    tp_local_layout,
)

D = 8
BYTES = 2
HEX = "ab" * 32


def spec(role: str, rank: int, alpha: int) -> ModuleSpec:
    return ModuleSpec(name=f"model.layers.0.self_attn.{role}", role=role, base_shape=(D, D),
                      rank=rank, alpha=Fraction(alpha), scaling_rule=SCALING_ALPHA_OVER_R,
                      dtype="bfloat16", a_sha256=HEX, b_sha256=HEX)


Q, V = spec("q_proj", 2, 4), spec("v_proj", 4, 8)


def layout(m: ModuleSpec, a: tuple[str, int, int] | None, b: tuple[str, int, int] | None
           ) -> LocalModuleLayout:
    return LocalModuleLayout(m.name, A_AXES, ("rank", "output"),
                             None if a is None else ShardRange(*a),
                             None if b is None else ShardRange(*b))


def halves(axis: str, length: int, rank: int) -> tuple[str, int, int]:
    half = length // 2
    return (axis, rank * half, (rank + 1) * half)


def per_rank(kind: str, m: ModuleSpec, tp_rank: int) -> LocalModuleLayout:
    if kind == "column_local":
        return layout(m, None, halves("output", D, tp_rank))
    if kind == "column_paper":
        return layout(m, halves("rank", m.rank, tp_rank), halves("output", D, tp_rank))
    if kind == "row_local":
        return layout(m, halves("input", D, tp_rank), None)
    if kind == "row_paper":
        return layout(m, halves("input", D, tp_rank), halves("output", D, tp_rank))
    raise ValueError(kind)


EXPECTED = {"column_local": (24, 48), "column_paper": (16, 32), "row_local": (24, 48),
            "row_paper": (16, 32)}


def test_logical_and_sharded_totals_example() -> None:
    """96 scalars / 192 bytes logical; 72 / 144 per rank; 288 bytes across two ranks."""
    ledger = residency_ledger((Q, V), tp_size=2)
    assert (ledger.logical_scalars, ledger.logical_bytes) == (96, 192)
    assert ledger.per_rank_scalars == (72, 72)
    assert ledger.per_rank_bytes == (144, 144)
    assert ledger.across_ranks_bytes == 288
    for r in range(2):
        total = sum(tp_local_layout(m, tp_rank=r, tp_size=2, split=SPLIT_OUTPUT)
                    .local_scalars(m) for m in (Q, V))
        assert (total, total * BYTES) == (72, 144)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_both_layouts_both_styles_per_module(kind: str) -> None:
    q_want, v_want = EXPECTED[kind]
    for r in range(2):
        assert per_rank(kind, Q, r).local_scalars(Q) == q_want
        assert per_rank(kind, V, r).local_scalars(V) == v_want


def test_paper_layouts_store_no_replica() -> None:
    """Both paper layouts shard every factor once: the two ranks hold exactly the 96
    logical scalars; the default layouts replicate one factor (72 + 72 = 144)."""
    for kind, across in (("column_paper", 96), ("row_paper", 96), ("column_local", 144),
                         ("row_local", 144)):
        assert sum(per_rank(kind, m, r).local_scalars(m)
                   for r in range(2) for m in (Q, V)) == across


def test_row_split_of_identity_helper_matches_hand_values() -> None:
    for r in range(2):
        assert tp_local_layout(Q, tp_rank=r, tp_size=2, split=SPLIT_INPUT).local_scalars(Q) == 24
        assert tp_local_layout(V, tp_rank=r, tp_size=2, split=SPLIT_INPUT).local_scalars(V) == 48


def test_rank_axis_of_b() -> None:
    """B [d_out, r] split on its rank axis keeps all 8 output rows of r/2 columns."""
    got = layout(V, None, ("rank", 0, 2)).local_scalars(V)
    assert got == 4 * 8 + 8 * 2


@pytest.mark.parametrize(("a", "b"), [(("output", 0, 4), None), (None, ("input", 0, 4)),
                                      (("rank", 0, 5), None), (None, ("output", 4, 9))])
def test_shard_on_missing_axis_or_past_its_end_is_rejected(
        a: tuple[str, int, int] | None, b: tuple[str, int, int] | None) -> None:
    with pytest.raises(IdentityError) as exc:
        layout(V, a, b).local_scalars(V)
    assert exc.value.code == "layout_mismatch"


def test_identity_module_does_not_import_torch() -> None:
    import subprocess

    code = ("import sys, dataplane.identity; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
