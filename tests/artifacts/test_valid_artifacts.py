"""Valid PEFT adapters: every ValidatedArtifact field checked against independent values
(PEFT's own LoRA layers, torch tensors + hashlib, Fraction arithmetic)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dataplane.artifacts import (
    ArtifactLimits,
    ArtifactRejected,
    BaseModelABI,
    RejectionCode,
    ValidatedArtifact,
    validate_peft_dir,
)
from dataplane.assets import make_peft_adapter

PREFIX = "base_model.model."


def tensor_sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def peft_layers(base_dir: Path, adapter: Path) -> dict[str, LoraLayer]:
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(model, adapter)
    return {name.removeprefix(PREFIX): module for name, module in peft_model.named_modules()
            if isinstance(module, LoraLayer)}


def check_against_references(artifact: ValidatedArtifact, adapter: Path, base_dir: Path,
                             base_abi: BaseModelABI, rslora: bool) -> None:
    factors = load_file(adapter / "adapter_model.safetensors")
    base_weights = load_file(base_dir / "model.safetensors")
    layers = peft_layers(base_dir, adapter)
    names = sorted({k[len(PREFIX):].rsplit(".lora_", 1)[0] for k in factors})
    assert [m.name for m in artifact.modules] == names == sorted(layers)
    for spec in artifact.modules:
        a = factors[f"{PREFIX}{spec.name}.lora_A.weight"]
        b = factors[f"{PREFIX}{spec.name}.lora_B.weight"]
        layer = layers[spec.name]
        assert spec.role == spec.name.rsplit(".", 1)[1]
        assert spec.base_shape == tuple(base_weights[f"{spec.name}.weight"].shape)
        assert spec.rank == layer.r["default"] == a.shape[0] == b.shape[1]
        assert spec.alpha == Fraction(layer.lora_alpha["default"])
        assert spec.scaling_rule == ("alpha/sqrt(r)" if rslora else "alpha/r")
        expected_sq = (spec.alpha**2 / spec.rank) if rslora else (spec.alpha / spec.rank) ** 2
        assert spec.scale_squared == expected_sq
        assert math.isclose(spec.scale, layer.scaling["default"], rel_tol=1e-12)
        assert (spec.a_sha256, spec.b_sha256) == (tensor_sha(a), tensor_sha(b))
        assert spec.dtype == str(a.dtype).removeprefix("torch.")
    assert artifact.total_params == sum(t.numel() for t in factors.values())
    assert artifact.total_bytes == sum(t.numel() * t.element_size() for t in factors.values())
    assert artifact.target_modules == tuple(sorted({n.rsplit(".", 1)[1] for n in names}))
    assert artifact.h_base == base_abi.h_base
    assert artifact.method == "lora"
    assert ValidatedArtifact.from_record(json.loads(json.dumps(artifact.to_record()))) == artifact


def test_rank_pattern_adapter(valid_adapter: Path, base_dir: Path,
                              base_abi: BaseModelABI) -> None:
    artifact = validate_peft_dir(valid_adapter, base_abi)
    check_against_references(artifact, valid_adapter, base_dir, base_abi, rslora=False)
    assert {m.role: m.rank for m in artifact.modules} == {"q_proj": 4, "v_proj": 2,
                                                         "down_proj": 4}
    assert artifact.max_rank == 4


def test_regex_rank_pattern_and_alpha_pattern_mixed_ranks(
    base_dir: Path, base_abi: BaseModelABI, tmp_path: Path,
) -> None:
    adapter = make_peft_adapter(
        base_dir, tmp_path / "mixed", seed=5, rank=4, alpha=16,
        target_modules=["q_proj", "k_proj", "down_proj"],
        rank_pattern={r"layers\.1\.self_attn\.q_proj": 8, "k_proj": 2},
        alpha_pattern={"down_proj": 3, r"layers\.0\.self_attn\.q_proj": 5},
    )
    artifact = validate_peft_dir(adapter, base_abi)
    check_against_references(artifact, adapter, base_dir, base_abi, rslora=False)
    ranks = {m.name.removeprefix("model.layers."): (m.rank, m.alpha) for m in artifact.modules}
    assert ranks["1.self_attn.q_proj"] == (8, 16)
    assert ranks["0.self_attn.q_proj"] == (4, 5)
    assert ranks["0.self_attn.k_proj"] == (2, 16)
    assert ranks["1.mlp.down_proj"] == (4, 3)


def test_rslora_bf16_adapter(base_dir: Path, base_abi: BaseModelABI, tmp_path: Path) -> None:
    adapter = make_peft_adapter(base_dir, tmp_path / "rs", seed=3, rank=4, alpha=6,
                                target_modules=["o_proj", "up_proj"], use_rslora=True,
                                dtype="bfloat16")
    artifact = validate_peft_dir(adapter, base_abi)
    check_against_references(artifact, adapter, base_dir, base_abi, rslora=True)
    assert artifact.dtype == "bfloat16"
    assert artifact.modules[0].scale_squared == Fraction(36, 4)


def test_bf16_nan_is_found_through_raw_bits(base_dir: Path, base_abi: BaseModelABI,
                                            tmp_path: Path) -> None:
    adapter = make_peft_adapter(base_dir, tmp_path / "bf", seed=4, rank=2, alpha=4,
                                target_modules=["q_proj"], dtype="bfloat16")
    path = adapter / "adapter_model.safetensors"
    blob = bytearray(path.read_bytes())
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    begin = header[f"{PREFIX}model.layers.1.self_attn.q_proj.lora_B.weight"]["data_offsets"][0]
    blob[8 + n + begin + 6:8 + n + begin + 8] = (0x7FC1).to_bytes(2, "little")  # bf16 NaN
    path.write_bytes(bytes(blob))
    with pytest.raises(ArtifactRejected) as info:
        validate_peft_dir(adapter, base_abi)
    assert info.value.code == RejectionCode.NON_FINITE


def test_identity_ignores_provenance_but_not_bytes_or_semantics(
    valid_adapter: Path, base_abi: BaseModelABI, tmp_path: Path,
) -> None:
    original = validate_peft_dir(valid_adapter, base_abi)

    def variant(name: str, config_changes: dict[str, object], flip_byte: bool = False) -> str:
        d = tmp_path / name
        shutil.copytree(valid_adapter, d)
        config = json.loads((d / "adapter_config.json").read_text())
        config.update(config_changes)
        (d / "adapter_config.json").write_text(json.dumps(config, indent=4))
        if flip_byte:
            blob = bytearray((d / "adapter_model.safetensors").read_bytes())
            blob[-3] ^= 0x01
            (d / "adapter_model.safetensors").write_bytes(bytes(blob))
        return validate_peft_dir(d, base_abi).h_artifact

    assert variant("prov", {"base_model_name_or_path": "elsewhere", "revision": "v2",
                            "lora_dropout": 0.1, "inference_mode": False}) == original.h_artifact
    assert variant("alpha", {"lora_alpha": 9}) != original.h_artifact
    assert variant("byte", {}, flip_byte=True) != original.h_artifact
    assert variant("rslora", {"use_rslora": True}) != original.h_artifact


def test_record_drift_is_refused(valid_adapter: Path, base_abi: BaseModelABI) -> None:
    record = validate_peft_dir(valid_adapter, base_abi).to_record()
    for key, value in (("total_params", 1), ("h_artifact", "0" * 64), ("dtype", "float16")):
        with pytest.raises(ArtifactRejected) as info:
            ValidatedArtifact.from_record({**record, key: value})
        assert info.value.code == RejectionCode.INCONSISTENT_RECORD


def test_rank_limit_256_accepts_what_128_refuses(base_dir: Path, base_abi: BaseModelABI,
                                                 tmp_path: Path) -> None:
    adapter = make_peft_adapter(base_dir, tmp_path / "big", seed=2, rank=160, alpha=16,
                                target_modules=["q_proj"])
    with pytest.raises(ArtifactRejected) as info:
        validate_peft_dir(adapter, base_abi)
    assert info.value.code == RejectionCode.RANK_LIMIT
    assert validate_peft_dir(adapter, base_abi, ArtifactLimits(max_rank=256)).max_rank == 160


def test_importing_artifacts_does_not_import_torch() -> None:
    code = ("import sys, dataplane.artifacts\n"
            "print(','.join(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_alora_is_accepted_and_its_activation_is_part_of_the_identity(
        valid_adapter: Path, base_dir: Path, base_abi: BaseModelABI, tmp_path: Path) -> None:
    """A PEFT aLoRA (saved by PEFT itself) validates; its invocation tokens are in the PEFT
    config digest (so in H_artifact) and decide the activation-policy digest of the
    semantic identity; the same factors as a plain LoRA are another function; the record
    round-trips with the tokens and a plain LoRA's record has no such key."""
    from dataplane.identity import ALWAYS_ON_POLICY_SHA256, activation_policy_sha256

    plain = validate_peft_dir(valid_adapter, base_abi)
    alora_dir = make_peft_adapter(base_dir, tmp_path / "alora", seed=3, rank=4, alpha=8,
                                  target_modules=["q_proj", "v_proj"],
                                  alora_invocation_tokens=[17, 4])
    alora = validate_peft_dir(alora_dir, base_abi)
    assert alora.invocation_tokens == (17, 4) and plain.invocation_tokens is None
    assert alora.activation_policy_sha256 == activation_policy_sha256([17, 4])
    assert plain.activation_policy_sha256 == ALWAYS_ON_POLICY_SHA256
    assert "alora_invocation_tokens" not in plain.to_record()
    record = json.loads(json.dumps(alora.to_record()))
    assert record["alora_invocation_tokens"] == [17, 4]
    assert ValidatedArtifact.from_record(record) == alora
    with pytest.raises(ArtifactRejected) as info:  # the tokens are bound to the record
        ValidatedArtifact.from_record({**record, "alora_invocation_tokens": "x"})
    assert info.value.code == RejectionCode.INCONSISTENT_RECORD

    def with_config(name: str, changes: dict[str, object]) -> ValidatedArtifact:
        d = tmp_path / name
        shutil.copytree(alora_dir, d)
        config = json.loads((d / "adapter_config.json").read_text())
        config.update(changes)
        (d / "adapter_config.json").write_text(json.dumps(config))
        return validate_peft_dir(d, base_abi)

    always_on = with_config("always-on", {"alora_invocation_tokens": None})
    other = with_config("other-invocation", {"alora_invocation_tokens": [4, 17]})
    assert len({alora.h_artifact, always_on.h_artifact, other.h_artifact}) == 3
    assert len({alora.h_adapter_semantic, always_on.h_adapter_semantic,
                other.h_adapter_semantic}) == 3
    # null and an absent field are the same plain LoRA (existing digests do not move)
    dropped = tmp_path / "dropped"
    shutil.copytree(alora_dir, dropped)
    config = json.loads((dropped / "adapter_config.json").read_text())
    del config["alora_invocation_tokens"]
    (dropped / "adapter_config.json").write_text(json.dumps(config))
    assert validate_peft_dir(dropped, base_abi).h_artifact == always_on.h_artifact
