"""One-field malformed artifacts, generated from one valid PEFT adapter; each asserts its code.

Every case copies the valid adapter (config dict + tensors), changes exactly one thing
(one config field, one tensor, one header field, one extra file, or the base it is
validated against) and must be refused with exactly the expected RejectionCode.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dataplane.artifacts import (
    ArtifactLimits,
    ArtifactRejected,
    BaseModelABI,
    RejectionCode,
    read_base_abi,
    validate_peft_dir,
)
from dataplane.assets import make_tiny_llama

from . import safetensors_files as st

P = "base_model.model.model.layers."
Q0A, Q0B = P + "0.self_attn.q_proj.lora_A.weight", P + "0.self_attn.q_proj.lora_B.weight"
V1A, V1B = P + "1.self_attn.v_proj.lora_A.weight", P + "1.self_attn.v_proj.lora_B.weight"
WEIGHTS = "adapter_model.safetensors"


@dataclass
class Ctx:
    """A mutable copy of the valid adapter; written to `dir` after the mutation."""

    dir: Path
    cfg: dict[str, Any]
    tensors: dict[str, np.ndarray]
    limits: ArtifactLimits = field(default_factory=ArtifactLimits)
    base: BaseModelABI | None = None
    write_config: bool = True
    write_tensors: bool = True

    def raw(self, header: dict[str, object] | bytes, data: bytes) -> None:
        text = header if isinstance(header, bytes) else json.dumps(header).encode()
        st.write_raw(self.dir / WEIGHTS, text, data)
        self.write_tensors = False


def cfg(**changes: Any) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        c.cfg.update(changes)
    return mutate


def drop_cfg(key: str) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        del c.cfg[key]
    return mutate


def tensor(key: str, value: np.ndarray | None) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        if value is None:
            del c.tensors[key]
        else:
            c.tensors[key] = value
    return mutate


def edit(key: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        c.tensors[key] = fn(c.tensors[key].copy())
    return mutate


def poke(value: float) -> Callable[[np.ndarray], np.ndarray]:
    def fn(a: np.ndarray) -> np.ndarray:
        a.flat[3] = value
        return a
    return fn


def header_edit(fn: Callable[[dict[str, Any], bytes], tuple[Any, bytes]]) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        header, data = st.header_for(c.tensors)
        c.raw(*fn(header, data))
    return mutate


def set_offsets(key: str, begin: int, end: int) -> Callable[[dict[str, Any], bytes], Any]:
    def fn(h: dict[str, Any], d: bytes) -> tuple[Any, bytes]:
        h[key]["data_offsets"] = [begin, end]
        return h, d
    return fn


def extra_file(name: str, content: bytes) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        (c.dir / name).write_bytes(content)
    return mutate


def raw_config(text: str) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        (c.dir / "adapter_config.json").write_text(text)
        c.write_config = False
    return mutate


def delete(name: str) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        c.write_config = c.write_config and name != "adapter_config.json"
        c.write_tensors = c.write_tensors and name != WEIGHTS
    return mutate


def limits(**kwargs: Any) -> Callable[[Ctx], None]:
    def mutate(c: Ctx) -> None:
        c.limits = ArtifactLimits(**kwargs)
    return mutate


def high_rank(c: Ctx) -> None:
    """A self-consistent adapter whose v_proj rank (130) exceeds the default limit 128."""
    rng = np.random.default_rng(0)
    c.cfg["rank_pattern"] = {"v_proj": 130}
    for layer in (0, 1):
        c.tensors[f"{P}{layer}.self_attn.v_proj.lora_A.weight"] = rng.standard_normal(
            (130, 64)).astype(np.float32) * 0.01
        c.tensors[f"{P}{layer}.self_attn.v_proj.lora_B.weight"] = rng.standard_normal(
            (32, 130)).astype(np.float32) * 0.01


def duplicate_key(c: Ctx) -> None:
    header, data = st.header_for(c.tensors)
    text = json.dumps(header)
    entry = json.dumps({Q0A: header[Q0A]})[1:-1]
    c.raw(text[:-1].encode() + b", " + entry.encode() + b"}", data)


def half_precision_v1(c: Ctx) -> None:
    """Layer 1's v_proj in float16, every other factor float32."""
    for key in (V1A, V1B):
        c.tensors[key] = c.tensors[key].astype(np.float16)


def huge_header_length(c: Ctx) -> None:
    header, data = st.header_for(c.tensors)
    text = json.dumps(header).encode()
    (c.dir / WEIGHTS).write_bytes((10**9).to_bytes(8, "little") + text + data)
    c.write_tensors = False


def other_base(c: Ctx) -> None:
    c.base = read_base_abi(make_tiny_llama(c.dir.parent / "other-base", seed=0,
                                           hidden_size=32, intermediate_size=96))


A = np.zeros((4, 64), np.float32)
C = RejectionCode
CASES: list[tuple[str, RejectionCode, Callable[[Ctx], None]]] = [
    ("pickle-bin-present", C.PICKLE_WEIGHTS, extra_file("adapter_model.bin", b"\x80\x04")),
    ("pickle-pt-present", C.PICKLE_WEIGHTS, extra_file("optimizer.pt", b"\x80\x04")),
    ("config-missing", C.MISSING_FILE, delete("adapter_config.json")),
    ("weights-missing", C.MISSING_FILE, delete(WEIGHTS)),
    ("weights-too-large", C.FILE_TOO_LARGE, limits(max_file_bytes=4096)),
    ("config-over-1mib", C.FILE_TOO_LARGE, cfg(notes=None, pad=[None] * 300_000)),
    ("config-not-json", C.MALFORMED_CONFIG, raw_config("{\"r\": 4,")),
    ("config-is-a-list", C.MALFORMED_CONFIG, raw_config("[]")),
    ("config-nan-constant", C.MALFORMED_CONFIG, raw_config('{"r": NaN}')),
    ("r-is-string", C.MALFORMED_CONFIG, cfg(r="4")),
    ("r-is-zero", C.MALFORMED_CONFIG, cfg(r=0)),
    ("alpha-negative", C.MALFORMED_CONFIG, cfg(lora_alpha=-8)),
    ("target-modules-missing", C.MALFORMED_CONFIG, drop_cfg("target_modules")),
    ("target-modules-bad-regex", C.MALFORMED_CONFIG, cfg(target_modules="(q_proj")),
    ("rank-pattern-not-int", C.MALFORMED_CONFIG, cfg(rank_pattern={"v_proj": 2.5})),
    ("peft-type-ia3", C.UNSUPPORTED_FEATURE, cfg(peft_type="IA3")),
    ("use-dora", C.UNSUPPORTED_FEATURE, cfg(use_dora=True)),
    ("bias-all", C.UNSUPPORTED_FEATURE, cfg(bias="all")),
    ("lora-bias", C.UNSUPPORTED_FEATURE, cfg(lora_bias=True)),
    ("modules-to-save", C.UNSUPPORTED_FEATURE, cfg(modules_to_save=["lm_head"])),
    ("target-embed-tokens", C.UNSUPPORTED_FEATURE,
     cfg(target_modules=["q_proj", "v_proj", "down_proj", "embed_tokens"])),
    ("fan-in-fan-out", C.UNSUPPORTED_FEATURE, cfg(fan_in_fan_out=True)),
    ("alora-invocation-empty", C.MALFORMED_CONFIG, cfg(alora_invocation_tokens=[])),
    ("alora-invocation-not-ids", C.MALFORMED_CONFIG, cfg(alora_invocation_tokens=[5, "6"])),
    ("alora-invocation-negative", C.MALFORMED_CONFIG, cfg(alora_invocation_tokens=[-1])),
    ("alora-invocation-bool", C.MALFORMED_CONFIG, cfg(alora_invocation_tokens=[True])),
    ("alora-invocation-outside-vocab", C.MALFORMED_CONFIG,
     cfg(alora_invocation_tokens=[5, 10**6])),
    ("unknown-config-field", C.UNSUPPORTED_FEATURE, cfg(lora_magic_mode="on")),
    ("header-length-huge", C.MALFORMED_SAFETENSORS, huge_header_length),
    ("header-not-json", C.MALFORMED_SAFETENSORS, lambda c: c.raw(b"{not json", b"")),
    ("header-metadata-not-str", C.MALFORMED_SAFETENSORS,
     header_edit(lambda h, d: ({**h, "__metadata__": {"format": 1}}, d))),
    ("offsets-out-of-range", C.MALFORMED_SAFETENSORS, header_edit(
        lambda h, d: set_offsets(V1B, h[V1B]["data_offsets"][0], 10**9)(h, d))),
    ("bytes-disagree-with-shape", C.MALFORMED_SAFETENSORS, header_edit(
        lambda h, d: ({**h, Q0A: {**h[Q0A], "shape": [4, 63]}}, d))),
    ("tensors-overlap", C.MALFORMED_SAFETENSORS, header_edit(
        lambda h, d: set_offsets(Q0B, h[Q0A]["data_offsets"][0],
                                 h[Q0A]["data_offsets"][0] + 1024)(h, d))),
    ("trailing-bytes", C.MALFORMED_SAFETENSORS, header_edit(lambda h, d: (h, d + b"\0" * 8))),
    ("truncated-data", C.MALFORMED_SAFETENSORS, header_edit(lambda h, d: (h, d[:-64]))),
    ("unknown-dtype-code", C.MALFORMED_SAFETENSORS, header_edit(
        lambda h, d: ({**h, Q0A: {**h[Q0A], "dtype": "Q4_1"}}, d))),
    ("duplicate-header-key", C.DUPLICATE_MODULE, duplicate_key),
    ("float64-factors", C.UNSUPPORTED_DTYPE, edit(Q0A, lambda a: a.astype(np.float64))),
    ("int8-factors", C.UNSUPPORTED_DTYPE, edit(Q0B, lambda a: a.astype(np.int8))),
    ("mixed-dtypes", C.UNSUPPORTED_DTYPE, half_precision_v1),
    ("lora-b-missing", C.MISSING_FACTOR, tensor(Q0B, None)),
    ("lora-a-missing", C.MISSING_FACTOR, tensor(V1A, None)),
    ("no-factors-at-all", C.MISSING_FACTOR, lambda c: c.tensors.clear()),
    ("a-b-rank-mismatch", C.RANK_MISMATCH, edit(Q0B, lambda b: b[:, :3].copy())),
    ("a-input-dim-wrong", C.SHAPE_MISMATCH, edit(Q0A, lambda a: a[:, :63].copy())),
    ("b-output-dim-wrong", C.SHAPE_MISMATCH, edit(V1B, lambda b: np.zeros((64, 2), b.dtype))),
    ("factor-is-3d", C.SHAPE_MISMATCH, edit(Q0A, lambda a: a.reshape(2, 2, 64))),
    ("module-not-in-base", C.UNKNOWN_MODULE, lambda c: c.tensors.update({
        Q0A.replace("layers.0.", "layers.7."): c.tensors[Q0A],
        Q0B.replace("layers.0.", "layers.7."): c.tensors[Q0B]})),
    ("magnitude-vector", C.UNEXPECTED_KEY,
     tensor(P + "0.self_attn.q_proj.lora_magnitude_vector", np.ones(64, np.float32))),
    ("lora-embedding", C.UNEXPECTED_KEY,
     tensor("base_model.model.model.embed_tokens.lora_embedding_A", np.ones((4, 256),
                                                                           np.float32))),
    ("key-without-peft-prefix", C.UNEXPECTED_KEY,
     tensor("model.layers.0.self_attn.k_proj.lora_A.weight", A)),
    ("trained-base-bias", C.UNSUPPORTED_FEATURE,
     tensor(P + "0.self_attn.q_proj.bias", np.zeros(64, np.float32))),
    ("lm-head-factors", C.UNSUPPORTED_FEATURE, lambda c: c.tensors.update({
        "base_model.model.lm_head.lora_A.weight": A,
        "base_model.model.lm_head.lora_B.weight": np.zeros((256, 4), np.float32)})),
    ("nan-in-a", C.NON_FINITE, edit(Q0A, poke(np.nan))),
    ("inf-in-b", C.NON_FINITE, edit(V1B, poke(-np.inf))),
    ("rank-above-limit", C.RANK_LIMIT, high_rank),
    ("config-r-disagrees", C.CONFIG_TENSOR_MISMATCH, cfg(r=8)),
    ("rank-pattern-disagrees", C.CONFIG_TENSOR_MISMATCH, cfg(rank_pattern={"v_proj": 4})),
    ("target-without-tensors", C.CONFIG_TENSOR_MISMATCH,
     cfg(target_modules=["q_proj", "k_proj", "v_proj", "down_proj"])),
    ("tensors-not-targeted", C.CONFIG_TENSOR_MISMATCH, cfg(target_modules=["q_proj", "v_proj"])),
    ("layers-to-transform-excludes", C.CONFIG_TENSOR_MISMATCH, cfg(layers_to_transform=[0])),
    ("regex-target-misses", C.CONFIG_TENSOR_MISMATCH, cfg(target_modules=r".*\.(q|v)_proj")),
    ("validated-against-other-base", C.WRONG_BASE, other_base),
]


@pytest.fixture(scope="module")
def valid_parts(valid_adapter: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    config = json.loads((valid_adapter / "adapter_config.json").read_text())
    return config, st.read(valid_adapter / WEIGHTS)


def test_corpus_is_large_and_covers_every_artifact_code() -> None:
    assert len(CASES) >= 40
    assert len({case_id for case_id, _, _ in CASES}) == len(CASES)
    assert {code for _, code, _ in CASES} == set(RejectionCode) - {C.INCONSISTENT_RECORD}


def test_unmodified_copy_is_valid(valid_parts: Any, base_abi: BaseModelABI,
                                  tmp_path: Path) -> None:
    """Guards the corpus: the writer itself produces an acceptable artifact."""
    config, tensors = valid_parts
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    st.write(tmp_path / WEIGHTS, tensors)
    assert validate_peft_dir(tmp_path, base_abi).total_params > 0


@pytest.mark.parametrize(("code", "mutate"), [pytest.param(c, m, id=i) for i, c, m in CASES])
def test_malformed_artifact_is_rejected_with_its_code(
    code: RejectionCode, mutate: Callable[[Ctx], None], valid_parts: Any,
    base_abi: BaseModelABI, tmp_path: Path,
) -> None:
    config, tensors = valid_parts
    ctx = Ctx(tmp_path / "adapter", json.loads(json.dumps(config)), dict(tensors))
    ctx.dir.mkdir()
    mutate(ctx)
    if ctx.write_config:
        (ctx.dir / "adapter_config.json").write_text(json.dumps(ctx.cfg))
    if ctx.write_tensors:
        st.write(ctx.dir / WEIGHTS, ctx.tensors)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in ctx.dir.iterdir())
    with pytest.raises(ArtifactRejected) as info:
        validate_peft_dir(ctx.dir, ctx.base or base_abi, ctx.limits)
    assert info.value.code == code, info.value.message
    assert isinstance(info.value.detail, dict)
    json.dumps(info.value.detail)  # detail is JSON-able
    assert sorted((p.name, p.stat().st_mtime_ns) for p in ctx.dir.iterdir()) == before
    shutil.rmtree(ctx.dir)
