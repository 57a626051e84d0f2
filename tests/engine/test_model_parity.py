"""Model forward (no engine) against HF transformers fp32 logits: architectures, RoPE
variants, loading layouts, chunked prefill over paged KV, decode rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dataplane.engine.model_runner import ModelRunner
from dataplane.models import ModelLoadError, UnsupportedModel, load_model

from .helpers import hf_logits, plan_for_chunk

TOL = dict(atol=2e-5, rtol=1e-4)
PROMPT = [5, 17, 33, 9, 100, 7, 250, 3, 64, 128, 12, 99]


def _runner(model_dir: Path, max_slots: int = 0) -> ModelRunner:
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    return ModelRunner(model, num_kv_blocks=16, block_size=4, max_rows=64,
                       max_slots=max_slots, max_rank=8)


def _save_hf(kind: str, dest: Path, seed: int, **fields: Any) -> Path:
    """A random tiny HF model of `kind` saved with save_pretrained (the reference side)."""
    import transformers

    cls_config, cls_model = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, tie_word_embeddings=False)
    base.update(fields)
    shard = base.pop("max_shard_size", None)
    model = cls_model(cls_config(**base)).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(dest, **kwargs)
    return dest


CASES = {
    "llama_tied_llama3_rope": ("llama", dict(
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=50000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8))),
    "llama_linear_rope_bias": ("llama", dict(
        attention_bias=True, mlp_bias=True,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    "llama_yarn_sharded": ("llama", dict(
        max_shard_size="100KB",
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=16))),
    "mistral_sliding_window": ("mistral", dict(sliding_window=5, head_dim=16)),
    "qwen2_bias": ("qwen2", dict()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_logits_match_hf(case: str, tmp_path: Path) -> None:
    kind, fields = CASES[case]
    model_dir = _save_hf(kind, tmp_path / case, seed=3, **fields)
    if fields.get("max_shard_size"):
        assert (model_dir / "model.safetensors.index.json").is_file()
    runner = _runner(model_dir)
    got = runner.execute(plan_for_chunk(PROMPT, 0, (5, 2, 9), 4, sample_all=True))
    torch.testing.assert_close(got, hf_logits(model_dir, PROMPT), **TOL)


def test_chunked_prefill_then_decode_matches_hf(tiny_llama: Path) -> None:
    """Chunks 5 + 4 + 3 over a scattered block table, then two decode rows."""
    runner = _runner(tiny_llama)
    table = (7, 0, 11, 3)
    seq = [*PROMPT, 44, 45]
    ref = hf_logits(tiny_llama, seq)
    got1 = runner.execute(plan_for_chunk(PROMPT[:5], 0, table, 4, sample_all=True))
    got2 = runner.execute(plan_for_chunk(PROMPT[5:9], 5, table, 4, sample_all=True))
    got3 = runner.execute(plan_for_chunk(PROMPT[9:], 9, table, 4, sample_all=True))
    torch.testing.assert_close(torch.cat([got1, got2, got3]), ref[:12], **TOL)
    for pos in (12, 13):
        got = runner.execute(plan_for_chunk([seq[pos]], pos, table, 4, decode=True))
        torch.testing.assert_close(got[0], ref[pos], **TOL)


def test_unsupported_and_broken_checkpoints_are_rejected(tiny_llama: Path, tmp_path: Path
                                                         ) -> None:
    import json
    import shutil

    bad = tmp_path / "gelu"
    shutil.copytree(tiny_llama, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    with pytest.raises(UnsupportedModel):
        load_model(bad, torch.float32, torch.device("cpu"))
    shrunk = tmp_path / "shrunk"
    shutil.copytree(tiny_llama, shrunk)
    (shrunk / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(shrunk, torch.float32, torch.device("cpu"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"no model\.safetensors"):
        load_model(tmp_path / "empty", torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_load_tracks_fp32_reference(tiny_llama: Path, dtype: torch.dtype) -> None:
    """fp16/bf16 weights and activations: logits within half-precision distance of HF fp32."""
    model = load_model(tiny_llama, dtype, torch.device("cpu"))
    assert model.embed_tokens.weight.dtype == dtype
    runner = ModelRunner(model, num_kv_blocks=16, block_size=4, max_rows=64, max_slots=0,
                         max_rank=8)
    got = runner.execute(plan_for_chunk(PROMPT, 0, (5, 2, 9), 4, sample_all=True))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, hf_logits(tiny_llama, PROMPT), atol=3e-2, rtol=3e-2)
