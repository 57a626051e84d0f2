"""A request's tokens do not depend on what it is batched with (greedy and seeded sampling),
including when its neighbours use other adapters and when it is preempted and recomputed."""

from __future__ import annotations

from pathlib import Path

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import Engine

from .helpers import adapter_pages

PROMPTS = [[5, 17, 33, 9, 100, 7], [1, 2, 3], [42] * 11, [8, 6, 7, 5, 3, 0, 9], [250, 1]]
ADAPTERS = ["attn_r4", None, "all_r8", "mlp_rs2", "attn_r4"]


def _engine(model_dir: Path, adapters: dict[str, Path], num_kv_blocks: int
            ) -> tuple[Engine, dict[str, object]]:
    engine = build_engine(EngineSpec.of(model_dir, max_num_seqs=5, max_num_batched_tokens=12,
                                   num_kv_blocks=num_kv_blocks, block_size=4, max_slots=3,
                                   max_rank=8, sampler_seed=123))
    return engine, {n: engine.register_adapter(p) for n, p in adapters.items()}


def _params(i: int, greedy: bool) -> SamplingParams:
    if greedy:
        return SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    return SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1000 + i, max_tokens=7,
                          ignore_eos=True)


def test_tokens_do_not_depend_on_batch_composition(tiny_llama: Path,
                                                   tiny_adapters: dict[str, Path]) -> None:
    pages = adapter_pages(tiny_llama, tiny_adapters, block_size=4)  # beside the KV blocks
    for greedy in (True, False):
        alone = []
        for i, (prompt, name) in enumerate(zip(PROMPTS, ADAPTERS, strict=True)):
            engine, handles = _engine(tiny_llama, tiny_adapters, num_kv_blocks=64 + pages)
            [out] = engine.generate([prompt], _params(i, greedy),
                                    [handles[name] if name else None])  # type: ignore[list-item]
            alone.append(out.token_ids)
        # All together, in reverse arrival order, in a pool small enough to preempt.
        engine, handles = _engine(tiny_llama, tiny_adapters, num_kv_blocks=9 + pages)
        order = list(reversed(range(len(PROMPTS))))
        outs = engine.generate([PROMPTS[i] for i in order], [_params(i, greedy) for i in order],
                               [handles[ADAPTERS[i]] if ADAPTERS[i] else None  # type: ignore[misc]
                                for i in order])
        assert engine.num_preemptions > 0
        together = {i: o.token_ids for i, o in zip(order, outs, strict=True)}
        assert [together[i] for i in range(len(PROMPTS))] == alone, f"greedy={greedy}"
    assert len(set(alone)) == len(alone)  # sampled outputs differ across requests
