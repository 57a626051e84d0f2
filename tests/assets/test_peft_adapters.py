"""PEFT adapter asset: real PEFT layout, deterministic, per-module ranks, sane non-zero deltas."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dataplane.assets import make_peft_adapter
from dataplane.assets.peft_adapters import DEFAULT_DELTA_SCALE

PREFIX = "base_model.model."


@pytest.fixture(scope="module")
def adapter(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(
        tiny_base, tmp_path_factory.mktemp("ad"), seed=7, rank=4, alpha=8,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2}, alpha_pattern={"down_proj": 3},
    )


def test_files_and_keys_follow_peft_layout(adapter: Path) -> None:
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json",
                                                  "adapter_model.safetensors"}
    assert not list(adapter.glob("*.bin"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["use_rslora"]) == (4, 8, False)
    assert config["rank_pattern"] == {"v_proj": 2}
    assert config["alpha_pattern"] == {"down_proj": 3}
    with safe_open(adapter / "adapter_model.safetensors", framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert len(shapes) == 2 * 3 * 2  # layers x modules x (A, B)
    for layer in range(2):
        base = f"{PREFIX}model.layers.{layer}."
        assert shapes[base + "self_attn.q_proj.lora_A.weight"] == [4, 64]
        assert shapes[base + "self_attn.q_proj.lora_B.weight"] == [64, 4]
        assert shapes[base + "self_attn.v_proj.lora_A.weight"] == [2, 64]
        assert shapes[base + "self_attn.v_proj.lora_B.weight"] == [32, 2]
        assert shapes[base + "mlp.down_proj.lora_A.weight"] == [4, 128]
        assert shapes[base + "mlp.down_proj.lora_B.weight"] == [64, 4]


def test_deterministic_per_seed(tiny_base: Path, adapter: Path, tmp_path: Path) -> None:
    kwargs = dict(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                  rank_pattern={"v_proj": 2}, alpha_pattern={"down_proj": 3})
    same = make_peft_adapter(tiny_base, tmp_path / "same", seed=7, **kwargs)  # type: ignore[arg-type]
    other = make_peft_adapter(tiny_base, tmp_path / "other", seed=8, **kwargs)  # type: ignore[arg-type]

    def sha(p: Path) -> str:
        return hashlib.sha256((p / "adapter_model.safetensors").read_bytes()).hexdigest()

    assert sha(same) == sha(adapter)
    assert sha(other) != sha(adapter)


def test_update_norm_is_scaled_against_the_base_weight(tiny_base: Path, adapter: Path) -> None:
    """||s B A||_F == delta_scale * ||W||_F per module, computed in float64 from the files."""
    base = load_file(tiny_base / "model.safetensors")
    factors = load_file(adapter / "adapter_model.safetensors")
    scales = {"q_proj": 8 / 4, "v_proj": 8 / 2, "down_proj": 3 / 4}
    checked = 0
    for key, a in factors.items():
        if ".lora_A." not in key:
            continue
        b = factors[key.replace(".lora_A.", ".lora_B.")]
        module = key[len(PREFIX):].replace(".lora_A.weight", "")
        s = scales[module.rsplit(".", 1)[1]]
        delta = s * (b.double() @ a.double())
        w = base[module + ".weight"].double()
        ratio = float(torch.linalg.matrix_norm(delta) / torch.linalg.matrix_norm(w))
        assert math.isclose(ratio, DEFAULT_DELTA_SCALE, rel_tol=1e-4)
        checked += 1
    assert checked == 6


def test_adapter_changes_outputs_and_stays_finite(tiny_base: Path, adapter: Path) -> None:
    ids = torch.tensor([[1, 17, 42, 99, 3]])
    model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = model(ids).logits
    peft_model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        adapted = peft_model(ids).logits
    assert torch.isfinite(adapted).all()
    diff = float((adapted - base_logits).abs().max())
    assert diff > 1e-3 * float(base_logits.abs().max())
    assert diff < 10.0 * float(base_logits.abs().max())


@pytest.mark.parametrize(("dtype", "code"), [("bfloat16", "BF16"), ("float16", "F16")])
def test_saved_dtype_and_rslora(tiny_base: Path, tmp_path: Path, dtype: str, code: str) -> None:
    out = make_peft_adapter(tiny_base, tmp_path / dtype, seed=1, rank=2, alpha=4,
                            target_modules=["k_proj"], use_rslora=True, dtype=dtype)
    assert json.loads((out / "adapter_config.json").read_text())["use_rslora"] is True
    with safe_open(out / "adapter_model.safetensors", framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 == {code}
        assert len(list(f.keys())) == 4
