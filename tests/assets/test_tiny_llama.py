"""The tiny Llama asset: real HF checkpoint, deterministic per seed, config overrides honoured."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from dataplane.assets import TINY_LLAMA_DEFAULTS, make_tiny_llama


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_base: Path, tmp_path: Path) -> None:
    again = make_tiny_llama(tmp_path / "again", seed=0)
    other = make_tiny_llama(tmp_path / "other", seed=1)
    assert file_sha(again / "model.safetensors") == file_sha(tiny_base / "model.safetensors")
    assert file_sha(other / "model.safetensors") != file_sha(tiny_base / "model.safetensors")


def test_layout_is_fp32_llama_with_expected_shapes(tiny_base: Path) -> None:
    config = json.loads((tiny_base / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"):
        assert config[key] == TINY_LLAMA_DEFAULTS[key]
    hidden, inter = TINY_LLAMA_DEFAULTS["hidden_size"], TINY_LLAMA_DEFAULTS["intermediate_size"]
    head_dim = hidden // TINY_LLAMA_DEFAULTS["num_attention_heads"]
    kv = head_dim * TINY_LLAMA_DEFAULTS["num_key_value_heads"]
    expected = {
        "self_attn.q_proj": [hidden, hidden],
        "self_attn.k_proj": [kv, hidden],
        "self_attn.v_proj": [kv, hidden],
        "self_attn.o_proj": [hidden, hidden],
        "mlp.gate_proj": [inter, hidden],
        "mlp.up_proj": [inter, hidden],
        "mlp.down_proj": [hidden, inter],
    }
    with safe_open(tiny_base / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        for layer in range(TINY_LLAMA_DEFAULTS["num_hidden_layers"]):
            for module, shape in expected.items():
                name = f"model.layers.{layer}.{module}.weight"
                assert list(f.get_slice(name).get_shape()) == shape
                assert f.get_slice(name).get_dtype() == "F32"
        assert "lm_head.weight" in keys  # untied by default


def test_overrides_change_the_architecture(tmp_path: Path) -> None:
    out = make_tiny_llama(tmp_path / "wide", seed=3, hidden_size=32, num_hidden_layers=1)
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (32, 1)


def test_loads_and_runs_in_transformers(tiny_base: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 200]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 4, TINY_LLAMA_DEFAULTS["vocab_size"])
    assert torch.isfinite(logits).all()
    assert float(logits.std()) > 0.0
