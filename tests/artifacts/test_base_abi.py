"""Base ABI: shapes from headers equal the real model's Linear layers; digests are
content-addressed (shard layout and provenance do not matter, weights and math do)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from dataplane.artifacts import ArtifactRejected, BaseModelABI, RejectionCode, read_base_abi
from dataplane.assets import make_tiny_llama


def test_module_shapes_equal_the_models_linear_layers(base_dir: Path,
                                                      base_abi: BaseModelABI) -> None:
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    linear = {name: tuple(m.weight.shape) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.")}
    assert dict(base_abi.module_shapes) == linear
    assert (base_abi.hidden_size, base_abi.num_hidden_layers, base_abi.vocab_size) == (64, 2, 256)
    assert (base_abi.num_attention_heads, base_abi.num_key_value_heads) == (4, 2)
    assert base_abi.architecture == "LlamaForCausalLM"
    assert base_abi.dtype == "float32"


def test_weights_digest_is_an_independent_per_tensor_digest(base_dir: Path,
                                                            base_abi: BaseModelABI) -> None:
    from safetensors.torch import load_file

    tensors = load_file(base_dir / "model.safetensors")
    record = {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "sha256": hashlib.sha256(t.contiguous().view(torch.uint8).numpy()
                                              .tobytes()).hexdigest()}
              for name, t in tensors.items()}
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    assert base_abi.weights_sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_sharding_and_provenance_do_not_change_h_base(base_dir: Path, base_abi: BaseModelABI,
                                                      tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    config = json.loads((tmp_path / "sharded" / "config.json").read_text())
    config["_name_or_path"] = "somewhere/else"
    (tmp_path / "sharded" / "config.json").write_text(json.dumps(config))
    assert read_base_abi(tmp_path / "sharded").h_base == base_abi.h_base


def test_weights_and_math_config_change_h_base(base_dir: Path, base_abi: BaseModelABI,
                                               tmp_path: Path) -> None:
    other = read_base_abi(make_tiny_llama(tmp_path / "seed1", seed=1))
    assert other.weights_sha256 != base_abi.weights_sha256
    assert other.h_base != base_abi.h_base
    assert other.target_map_sha256 == base_abi.target_map_sha256
    eps = tmp_path / "eps"
    shutil.copytree(base_dir, eps)
    config = json.loads((eps / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (eps / "config.json").write_text(json.dumps(config))
    changed = read_base_abi(eps)
    assert changed.config_sha256 != base_abi.config_sha256
    assert changed.weights_sha256 == base_abi.weights_sha256
    assert changed.h_base != base_abi.h_base


def test_record_round_trip_and_drift(base_abi: BaseModelABI) -> None:
    record = json.loads(json.dumps(base_abi.to_record()))
    assert BaseModelABI.from_record(record) == base_abi
    shapes = dict(record["module_shapes"])
    shapes["model.layers.0.self_attn.q_proj"] = [64, 65]
    for drifted in ({**record, "module_shapes": shapes}, {**record, "h_base": "0" * 64},
                    {**record, "weights_sha256": "nope"}):
        with pytest.raises(ArtifactRejected) as info:
            BaseModelABI.from_record(drifted)
        assert info.value.code == RejectionCode.INCONSISTENT_RECORD


def test_pickle_only_or_incomplete_base_is_refused(base_dir: Path, tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(base_dir / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ArtifactRejected) as info:
        read_base_abi(pickled)
    assert info.value.code == RejectionCode.PICKLE_WEIGHTS
    (pickled / "pytorch_model.bin").unlink()
    with pytest.raises(ArtifactRejected) as info:
        read_base_abi(pickled)
    assert info.value.code == RejectionCode.MISSING_FILE
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    shutil.copy(base_dir / "model.safetensors", no_config)
    with pytest.raises(ArtifactRejected) as info:
        read_base_abi(no_config)
    assert info.value.code == RejectionCode.MISSING_FILE
