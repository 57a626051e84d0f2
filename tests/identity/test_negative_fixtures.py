"""Single-field mutations that must be refused, each with its stable code."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

import pytest

from dataplane.identity import (
    SPLIT_OUTPUT,
    ArtifactIdentity,
    BaseIdentity,
    CacheABI,
    IdentityError,
    KernelLocalIdentity,
    ModuleSpec,
    RequestBinding,
    SlotBinding,
    activation_policy_sha256,
    canonical_json,
    prefix_key,
    residency_ledger,
    tp_local_layout,
)

H = hashlib.sha256(b"x").hexdigest()


def module(role: str = "q_proj", **changes: object) -> ModuleSpec:
    fields: dict[str, object] = dict(
        name=f"model.layers.0.self_attn.{role}", role=role, base_shape=(8, 8), rank=2,
        alpha=Fraction(4), scaling_rule="alpha/r", dtype="bfloat16", a_sha256=H, b_sha256=H,
    )
    fields.update(changes)
    return ModuleSpec(**fields)  # type: ignore[arg-type]


Q, V = module("q_proj"), module("v_proj")


def semantic() -> str:
    return hashlib.sha256(b"semantic").hexdigest()


CASES: list[tuple[str, str, Callable[[], object]]] = [
    ("duplicate-module", "duplicate_module", lambda: ArtifactIdentity("lora", H, H, (Q, Q))),
    ("unsorted-modules", "unsorted_modules", lambda: ArtifactIdentity("lora", H, H, (V, Q))),
    ("no-modules", "no_modules", lambda: ArtifactIdentity("lora", H, H, ())),
    ("empty-method", "invalid_field", lambda: ArtifactIdentity("", H, H, (Q,))),
    ("short-base-digest", "invalid_digest", lambda: ArtifactIdentity("lora", H, H[:-1], (Q,))),
    ("upper-hex-digest", "invalid_digest",
     lambda: BaseIdentity(H.upper(), H, H, H)),
    ("rank-zero", "invalid_field", lambda: module(rank=0)),
    ("rank-bool", "invalid_field", lambda: module(rank=True)),
    ("alpha-float", "invalid_field", lambda: module(alpha=4.0)),
    ("unknown-scaling-rule", "invalid_field", lambda: module(scaling_rule="alpha*r")),
    ("unknown-dtype", "invalid_field", lambda: module(dtype="int8")),
    ("three-dim-base-shape", "invalid_field", lambda: module(base_shape=(8, 8, 8))),
    ("zero-base-dim", "invalid_field", lambda: module(base_shape=(0, 8))),
    ("bad-a-hash", "invalid_digest", lambda: module(a_sha256="zz")),
    ("record-shape-drift", "inconsistent_record",
     lambda: ModuleSpec.from_record({**Q.to_record(), "a_shape": [3, 8]})),
    ("record-axes-drift", "inconsistent_record",
     lambda: ModuleSpec.from_record({**Q.to_record(), "b_axes": ["rank", "output"]})),
    ("record-missing-field", "invalid_field",
     lambda: ModuleSpec.from_record({k: v for k, v in Q.to_record().items() if k != "rank"})),
    ("indivisible-shard", "indivisible_shard",
     lambda: tp_local_layout(module(base_shape=(9, 8)), tp_rank=0, tp_size=2,
                             split=SPLIT_OUTPUT)),
    ("tp-rank-out-of-range", "invalid_field",
     lambda: tp_local_layout(Q, tp_rank=2, tp_size=2, split=SPLIT_OUTPUT)),
    ("unknown-split", "invalid_field",
     lambda: tp_local_layout(Q, tp_rank=0, tp_size=2, split="diagonal")),
    ("layout-for-other-module", "layout_mismatch",
     lambda: tp_local_layout(Q, tp_rank=0, tp_size=1, split=SPLIT_OUTPUT).local_scalars(V)),
    ("kernel-duplicate-layout", "duplicate_module",
     lambda: KernelLocalIdentity(
         semantic(), "triton", 1, "bfloat16", "dense",
         (tp_local_layout(Q, tp_rank=0, tp_size=1, split=SPLIT_OUTPUT),) * 2)),
    ("kernel-unknown-dtype", "invalid_field",
     lambda: KernelLocalIdentity(semantic(), "triton", 1, "fp8", "dense", ())),
    ("ledger-duplicate", "duplicate_module", lambda: residency_ledger([Q, Q])),
    ("request-negative-attempt", "invalid_field",
     lambda: RequestBinding("ns", "r", -1, H, H, H)),
    ("slot-bad-kernel-digest", "invalid_digest",
     lambda: SlotBinding(0, "cuda:0", 3, 11, 11, H, "nope")),
    ("cache-zero-block", "invalid_field", lambda: CacheABI(H, H, "bfloat16", 0)),
    ("prefix-negative-token", "invalid_field",
     lambda: prefix_key(H, [1, -2], isolation_namespace="ns")),
    ("prefix-empty-namespace", "invalid_field",
     lambda: prefix_key(H, [1], isolation_namespace="")),
    ("alora-no-tokens", "invalid_field", lambda: activation_policy_sha256([])),
    ("float-in-json", "float_not_allowed", lambda: canonical_json({"s": 0.5})),
    ("set-in-json", "unsupported_type", lambda: canonical_json({"s": {1, 2}})),
    ("int-key-in-json", "unsupported_type", lambda: canonical_json({1: "a"})),
    ("huge-int-in-json", "integer_out_of_range", lambda: canonical_json(2**60)),
]


@pytest.mark.parametrize(("code", "build"), [pytest.param(c, b, id=i) for i, c, b in CASES])
def test_refused_with_code(code: str, build: Callable[[], object]) -> None:
    with pytest.raises(IdentityError) as info:
        build()
    assert info.value.code == code


def test_exact_scales() -> None:
    assert Q.scale_squared == Fraction(4, 1)  # (4/2)^2
    rs = replace(Q, scaling_rule="alpha/sqrt(r)")
    assert rs.scale_squared == Fraction(8, 1)  # 4^2/2
    assert rs.scale == pytest.approx(4 / 2**0.5)
    assert replace(Q, alpha=Fraction(8, 2)).to_record() == Q.to_record()
    assert replace(Q, alpha=Fraction(9, 2)).to_record()["alpha"] == {"num": 9, "den": 2}


def test_record_round_trip() -> None:
    assert ModuleSpec.from_record(Q.to_record()) == Q


def test_activation_policies_are_distinct() -> None:
    always = activation_policy_sha256()
    assert activation_policy_sha256(None) == always
    assert activation_policy_sha256([10, 11]) != always
    assert activation_policy_sha256([10, 11]) != activation_policy_sha256([11, 10])
