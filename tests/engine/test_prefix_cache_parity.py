"""Prefix-cache hits feed attention from cached blocks (a chunk that does not start at
position 0): outputs still equal HF + PEFT alone; another adapter never reuses the blocks."""

from __future__ import annotations

from pathlib import Path

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine

from .helpers import HFReference

PREFIX = [17, 4, 99, 23, 8, 150, 61, 2, 77, 31, 5, 12]  # three full blocks of 4


def test_prefix_hits_match_hf(tiny_llama: Path, tiny_adapters: dict[str, Path]) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, max_num_seqs=4, max_num_batched_tokens=64,
                                   num_kv_blocks=160, block_size=4, max_slots=2, max_rank=8))
    h = engine.register_adapter(tiny_adapters["all_r8"])
    other = engine.register_adapter(tiny_adapters["attn_r4"])
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine.generate([[*PREFIX, 9]], params, [h])  # fills and publishes the prefix blocks
    cases = [([*PREFIX, 40, 41], h, "all_r8", True), ([*PREFIX, 40, 41], other, "attn_r4", False),
             ([*PREFIX, 3], None, None, False)]
    hf = HFReference(tiny_llama, tiny_adapters)
    for prompt, handle, name, expect_hit in cases:
        engine.add_request(f"q-{name}", prompt, params, handle)
        engine.step()
        seq = next(s for s in engine.scheduler.running if s.request_id == f"q-{name}")
        assert (seq.num_cached_tokens == len(PREFIX)) is expect_hit, name
        final = None
        while engine.has_unfinished():
            final = next((o for o in engine.step() if o.finished), final)
        assert final is not None
        ref, _ = hf.greedy(prompt, 5, name)
        assert list(final.token_ids) == ref, name
