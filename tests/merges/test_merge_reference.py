"""Merged checkpoints against the reference implementation (HF transformers + PEFT with
the adapters live), the one-rounding property across dtypes, identity and the gate."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from controlplane.merges.compute import MergeAdapter, load_merge_adapter, merge_checkpoint
from controlplane.merges.gate import exactness_gate, probe_prompts
from controlplane.merges.manifest import build_manifest, h_merged
from controlplane.merges.thresholds import THRESHOLDS
from dataplane.artifacts import BaseModelABI, read_base_abi, validate_peft_dir
from tests.merges.conftest import MergeAssets

PROMPTS = [[1, 7, 42, 99, 3, 250, 17, 8], [200, 5, 5, 61, 128, 0, 77]]


def _adapters(base: BaseModelABI, dirs: list[Path]) -> list[MergeAdapter]:
    return [load_merge_adapter(d, base, Fraction(1),
                               expected_h_artifact=validate_peft_dir(d, base).h_artifact,
                               max_rank=64) for d in dirs]


def _peft_logits(base_dir: Path, dirs: list[Path]) -> list[torch.Tensor]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    names = [f"a{i}" for i in range(len(dirs))]
    model = PeftModel.from_pretrained(model, str(dirs[0]), adapter_name=names[0])
    for name, directory in zip(names[1:], dirs[1:], strict=True):
        model.load_adapter(str(directory), adapter_name=name)
    model.base_model.set_adapter(names)  # every adapter live at once, summed
    model.eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0] for p in PROMPTS]


def _hf_logits(model_dir: Path) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        return [model.eval()(torch.tensor([p])).logits[0] for p in PROMPTS]


def _max_relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max())
               for g, w in zip(got, want, strict=True))


CONFIGS = {
    "rank_and_alpha_patterns": ["patterned"],
    "rslora": ["rslora"],
    "two_adapters_in_order": ["patterned", "rslora"],
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_fp32_merge_matches_peft_live(merge_assets: MergeAssets, tmp_path: Path,
                                      config: str) -> None:
    dirs = [getattr(merge_assets, name) for name in CONFIGS[config]]
    base = read_base_abi(merge_assets.base)
    # a small shard bound: several shard files and an index, which transformers loads
    merged = merge_checkpoint(merge_assets.base, base, _adapters(base, dirs), "fp32",
                              tmp_path / "out", shard_bytes=200_000)
    assert "model.safetensors.index.json" in merged.files
    reference = _peft_logits(merge_assets.base, dirs)
    got = _hf_logits(tmp_path / "out")
    assert _max_relative(got, reference) < 1e-5
    assert max(float((g - r).abs().max()) for g, r in zip(got, reference, strict=True)) < 1e-5
    base_only = _hf_logits(merge_assets.base)
    assert _max_relative(base_only, reference) > 1e-2  # the adapters change the output


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                out[name] = handle.get_tensor(name)
    return out


def test_half_precision_releases_are_the_fp32_sum_rounded_once(merge_assets: MergeAssets,
                                                               tmp_path: Path) -> None:
    dirs = [merge_assets.patterned, merge_assets.rslora]
    base = read_base_abi(merge_assets.base)
    adapters = _adapters(base, dirs)
    merge_checkpoint(merge_assets.base, base, adapters, "fp32", tmp_path / "fp32")
    full = _tensors(tmp_path / "fp32")
    reference = _peft_logits(merge_assets.base, dirs)
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        merge_checkpoint(merge_assets.base, base, adapters, dtype, tmp_path / dtype)
        half = _tensors(tmp_path / dtype)
        assert sorted(half) == sorted(full)
        for name, tensor in half.items():
            assert tensor.dtype == torch_dtype
            assert torch.equal(tensor, full[name].to(torch_dtype)), name
        assert read_base_abi(tmp_path / dtype).dtype == {"bf16": "bfloat16",
                                                         "fp16": "float16"}[dtype]
        # documented gate tolerance of the dtype, against the reference implementation
        assert _max_relative(_hf_logits(tmp_path / dtype), reference) <= THRESHOLDS[dtype]


def _manifest(base_dir: Path, base: BaseModelABI, adapters: list[MergeAdapter], out: Path,
              shard_bytes: int) -> dict[str, Any]:
    merged = merge_checkpoint(base_dir, base, adapters, "bf16", out, shard_bytes=shard_bytes)
    released = read_base_abi(out)
    return build_manifest(base, [(a.artifact.h_artifact, a.weight) for a in adapters],
                          released.dtype, merged.modules, merged.tensors,
                          released.config_sha256)


def test_identity_is_content_not_layout(merge_assets: MergeAssets, tmp_path: Path) -> None:
    base = read_base_abi(merge_assets.base)
    adapters = _adapters(base, [merge_assets.patterned, merge_assets.plain])
    one_file = _manifest(merge_assets.base, base, adapters, tmp_path / "one", 1 << 30)
    sharded = _manifest(merge_assets.base, base, adapters, tmp_path / "many", 100_000)
    assert h_merged(one_file) == h_merged(sharded)
    assert read_base_abi(tmp_path / "one").h_base == read_base_abi(tmp_path / "many").h_base
    halved = [MergeAdapter(a.directory, a.artifact, Fraction(1, 2)) for a in adapters]
    reordered = list(reversed(adapters))
    for index, variant in enumerate((halved, reordered)):
        other = _manifest(merge_assets.base, base, variant, tmp_path / f"v{index}", 1 << 30)
        assert h_merged(other) != h_merged(one_file)
    assert one_file["adapters"][0] == {"h_artifact": adapters[0].artifact.h_artifact,
                                       "weight": {"num": 1, "den": 1}}


def test_gate_passes_fp32_and_refuses_at_a_zero_threshold(merge_assets: MergeAssets,
                                                         tmp_path: Path) -> None:
    base = read_base_abi(merge_assets.base)
    adapters = _adapters(base, [merge_assets.rslora, merge_assets.plain])
    for dtype in ("fp32", "bf16"):
        merge_checkpoint(merge_assets.base, base, adapters, dtype, tmp_path / dtype)
    ok = exactness_gate(merge_assets.base, tmp_path / "fp32", adapters, base.vocab_size,
                        THRESHOLDS["fp32"])
    assert ok.passed and ok.max_relative_error < 1e-5
    assert len(ok.per_probe) == len(probe_prompts(base.vocab_size))
    refused = exactness_gate(merge_assets.base, tmp_path / "bf16", adapters, base.vocab_size,
                             Fraction(0))
    assert not refused.passed and refused.max_relative_error > 0
    assert refused.metrics()["threshold"] == "0/1"
