"""The two-module rank-and-shard identity example, as exact test vectors.

q_proj r2 α4 A[2,8] B[8,2]; v_proj r4 α8 A[4,8] B[8,4]; 2 bytes/scalar; TP=2 with A
replicated and B output-sharded. Expected numbers are worked out by hand, never taken
from the code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from fractions import Fraction

import pytest

from dataplane.identity import (
    SCALING_ALPHA_OVER_R,
    SPLIT_OUTPUT,
    ArtifactIdentity,
    BaseIdentity,
    CacheABI,
    KernelLocalIdentity,
    ModuleSpec,
    RequestBinding,
    SlotBinding,
    digest,
    h_adapter_semantic,
    prefix_key,
    residency_ledger,
    tp_local_layout,
)

D = 8  # both projections are [8, 8]
BYTES_PER_SCALAR = 2


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def factor_bytes(tag: int, rows: int, cols: int) -> bytes:
    """Deterministic fake bf16 payload of a [rows, cols] factor."""
    return bytes((tag * 31 + i) % 251 for i in range(rows * cols * BYTES_PER_SCALAR))


BASE = BaseIdentity(sha(b"weights"), sha(b"config"), sha(b"transforms"), sha(b"target-map"))


def spec(
    role: str, rank: int, alpha: int, tag: int, *, payload_edit: int | None = None
) -> ModuleSpec:
    a = bytearray(factor_bytes(tag, rank, D))
    if payload_edit is not None:
        a[payload_edit] ^= 0x01
    return ModuleSpec(
        name=f"model.layers.0.self_attn.{role}", role=role, base_shape=(D, D), rank=rank,
        alpha=Fraction(alpha), scaling_rule=SCALING_ALPHA_OVER_R, dtype="bfloat16",
        a_sha256=sha(bytes(a)), b_sha256=sha(factor_bytes(tag + 1, D, rank)),
    )


Q = spec("q_proj", 2, 4, tag=1)
V = spec("v_proj", 4, 8, tag=3)
PEFT_CONFIG = sha(b'{"r": 2}')
ARTIFACT = ArtifactIdentity("lora", PEFT_CONFIG, BASE.h_base, (Q, V))
GEN_POLICY = digest({"temperature": {"num": 0, "den": 1}})


def semantic(artifact: ArtifactIdentity) -> str:
    return h_adapter_semantic(BASE.h_base, artifact.h_artifact)


def cache_abi(artifact: ArtifactIdentity) -> CacheABI:
    return CacheABI(BASE.h_base, semantic(artifact), kv_dtype="bfloat16", block_tokens=16)


def kernel_local(artifact: ArtifactIdentity, tp_rank: int) -> KernelLocalIdentity:
    layouts = tuple(tp_local_layout(m, tp_rank=tp_rank, tp_size=2, split=SPLIT_OUTPUT)
                    for m in artifact.modules)
    return KernelLocalIdentity(semantic(artifact), "triton-sgmv", 1, "bfloat16", "dense",
                               layouts, tp_rank=tp_rank, tp_size=2)


def slot(artifact: ArtifactIdentity, generation: int) -> SlotBinding:
    return SlotBinding(worker_epoch=1, device_id="cuda:0", slot_index=3,
                       slot_generation=generation, pointer_table_generation=generation,
                       adapter_semantic=semantic(artifact),
                       kernel_local=kernel_local(artifact, 0).h_kernel_local)


PROMPT = [1, 15043, 29892, 3186]


def test_logical_and_per_rank_residency() -> None:
    ledger = residency_ledger([Q, V], tp_size=2)
    assert ledger.logical_scalars == 2 * (8 + 8) + 4 * (8 + 8) == 96
    assert ledger.logical_bytes == 192
    assert ledger.per_rank_scalars == (72, 72)
    assert ledger.per_rank_bytes == (144, 144)
    assert ledger.across_ranks_bytes == 288


def test_tp_rank_layout_holds_all_of_a_and_half_of_b() -> None:
    for q in (0, 1):
        layout = tp_local_layout(V, tp_rank=q, tp_size=2, split=SPLIT_OUTPUT)
        assert layout.a_shard is None  # A replicated
        assert layout.b_shard is not None
        assert (layout.b_shard.start, layout.b_shard.stop) == (q * 4, (q + 1) * 4)
        assert layout.b_axes == ("rank", "output")  # physical [rank, output_shard]
        assert layout.local_scalars(V) == 4 * 8 + 4 * 4
    assert kernel_local(ARTIFACT, 0).h_kernel_local != kernel_local(ARTIFACT, 1).h_kernel_local


def test_h_artifact_matches_an_independent_canonical_serialisation() -> None:
    """ASCII-only int/str JSON: RFC 8785 == json.dumps(sort_keys, compact separators)."""

    def module(m: ModuleSpec, rank: int, alpha: int) -> dict[str, object]:
        return {"name": m.name, "role": m.role, "base_shape": [8, 8], "rank": rank,
                "alpha": {"num": alpha, "den": 1}, "scaling_rule": "alpha/r",
                "dtype": "bfloat16", "a_axes": ["rank", "input"], "b_axes": ["output", "rank"],
                "a_shape": [rank, 8], "b_shape": [8, rank],
                "a_sha256": m.a_sha256, "b_sha256": m.b_sha256}

    def ref_digest(value: object) -> str:
        return sha(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())

    h_base = ref_digest({"model_weights_sha256": sha(b"weights"),
                         "model_config_sha256": sha(b"config"),
                         "weight_transform_sha256": sha(b"transforms"),
                         "target_module_map_sha256": sha(b"target-map")})
    assert BASE.h_base == h_base
    expected = ref_digest({"method": "lora", "peft_config_sha256": PEFT_CONFIG,
                           "h_base": h_base, "modules": [module(Q, 2, 4), module(V, 4, 8)]})
    assert ARTIFACT.h_artifact == expected


def test_reload_into_new_slot_generation_changes_only_the_slot_binding() -> None:
    reloaded = ArtifactIdentity("lora", PEFT_CONFIG, BASE.h_base, (Q, V))  # same bytes
    assert reloaded.h_artifact == ARTIFACT.h_artifact
    assert semantic(reloaded) == semantic(ARTIFACT)
    assert cache_abi(reloaded).sha256 == cache_abi(ARTIFACT).sha256
    assert (prefix_key(cache_abi(reloaded).sha256, PROMPT, isolation_namespace="acme")
            == prefix_key(cache_abi(ARTIFACT).sha256, PROMPT, isolation_namespace="acme"))
    request = RequestBinding("acme", "req-17", 0, BASE.h_base, semantic(ARTIFACT), GEN_POLICY)
    again = RequestBinding("acme", "req-17", 0, BASE.h_base, semantic(reloaded), GEN_POLICY)
    assert request.sha256 == again.sha256
    assert slot(ARTIFACT, 11).sha256 != slot(reloaded, 12).sha256
    assert slot(ARTIFACT, 11).sha256 == slot(reloaded, 11).sha256


@pytest.mark.parametrize(
    "mutated",
    [
        pytest.param((Q, spec("v_proj", 2, 8, tag=3)), id="v_proj-rank-4-to-2"),
        pytest.param((Q, spec("v_proj", 4, 8, tag=3, payload_edit=5)), id="one-factor-byte"),
        pytest.param((spec("k_proj", 2, 4, tag=1), V), id="retarget-q-to-k"),
        pytest.param((Q, replace(V, alpha=Fraction(16))), id="v_proj-alpha"),
    ],
)
def test_content_change_changes_artifact_semantic_cache_and_prefix(
    mutated: tuple[ModuleSpec, ModuleSpec],
) -> None:
    changed = ArtifactIdentity("lora", PEFT_CONFIG, BASE.h_base, mutated)
    assert changed.h_artifact != ARTIFACT.h_artifact
    assert semantic(changed) != semantic(ARTIFACT)
    assert cache_abi(changed).sha256 != cache_abi(ARTIFACT).sha256
    assert (prefix_key(cache_abi(changed).sha256, PROMPT, isolation_namespace="acme")
            != prefix_key(cache_abi(ARTIFACT).sha256, PROMPT, isolation_namespace="acme"))


def test_prefix_key_ignores_request_and_slot_but_not_tokens_or_namespace() -> None:
    abi = cache_abi(ARTIFACT).sha256
    key = prefix_key(abi, PROMPT, isolation_namespace="acme")
    assert prefix_key(abi, [*PROMPT, 7], isolation_namespace="acme") != key
    assert prefix_key(abi, PROMPT, isolation_namespace="other") != key
    assert prefix_key(abi, PROMPT, isolation_namespace="acme",
                      side_inputs_sha256=digest({"image": sha(b"x")})) != key
    base_only = CacheABI(BASE.h_base, None, kv_dtype="bfloat16", block_tokens=16)
    assert prefix_key(base_only.sha256, PROMPT, isolation_namespace="acme") != key


def test_request_binding_separates_attempts_and_namespaces() -> None:
    first = RequestBinding("acme", "req-17", 0, BASE.h_base, semantic(ARTIFACT), GEN_POLICY)
    assert replace(first, attempt=1).sha256 != first.sha256
    assert replace(first, namespace="other").sha256 != first.sha256
    assert replace(first, adapter_semantic=None).sha256 != first.sha256
