"""SmolLM2-135M (the demo model, tied embeddings, GQA 9/3) with two PEFT adapters: a mixed
batch gives HF transformers + PEFT's greedy tokens for each request run alone."""

from __future__ import annotations

from pathlib import Path

from dataplane.assets import make_peft_adapter
from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine

from .helpers import HFReference

# (prompt, adapter) of the mixed batch: q/v rank 8, base, all-linear rank 4 rsLoRA
REQUESTS = [([1, 504, 3458, 314, 260, 1167, 30], "qv8"), ([1, 19556, 28, 1431], None),
            ([2683, 253, 2777, 16945, 282, 4196, 30, 1431, 2683, 253], "all4")]


def smollm2_adapters(model_dir: Path, root: Path) -> dict[str, Path]:
    """The two PEFT adapters REQUESTS name."""
    return {
        "qv8": make_peft_adapter(model_dir, root / "qv8", seed=1, rank=8, alpha=16,
                                 target_modules=["q_proj", "v_proj"]),
        "all4": make_peft_adapter(model_dir, root / "all4", seed=2, rank=4, alpha=4,
                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"],
                                  use_rslora=True),
    }


def test_smollm2_mixed_adapters_match_hf(smollm2: Path, tmp_path: Path) -> None:
    adapters = smollm2_adapters(smollm2, tmp_path)
    engine = build_engine(EngineSpec.of(smollm2, max_num_seqs=4, max_num_batched_tokens=32,
                                   num_kv_blocks=160, block_size=8, max_slots=2, max_rank=8))
    handles = {n: engine.register_adapter(p) for n, p in adapters.items()}
    requests = REQUESTS
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = engine.generate([p for p, _ in requests], params,
                           [handles[a] if a else None for _, a in requests])
    hf = HFReference(smollm2, adapters)
    for (prompt, name), out in zip(requests, outs, strict=True):
        ref, _ = hf.greedy(prompt, 4, name)
        assert list(out.token_ids) == ref, name
    # Text in, text out through the model directory's tokenizer.
    [text_out] = engine.generate(["The capital of France is"], params, [handles["qv8"]])
    assert engine.tokenizer is not None
    ids = engine.tokenizer.encode("The capital of France is")
    ref, _ = hf.greedy(ids, 4, "qv8")
    assert list(text_out.token_ids) == ref
    assert text_out.text == engine.tokenizer.decode(ref)
