"""A real model across three TP ranks: SmolLM2-135M (9 heads / 3 KV heads, MLP 1,536,
vocab 49,152 with tied embeddings: every sharded dimension splits over 3) on three gloo
ranks, launched as the agent launches them, async scheduling on. Each request of a mixed
batch (base, q/v rank 8, all-linear rank 4 rsLoRA) gives HF transformers + PEFT's greedy
tokens for that request run alone."""

from __future__ import annotations

from pathlib import Path

from agent.tp_ranks import TPLaunchSpec, launch_tp_ranks
from dataplane.core import SamplingParams
from dataplane.engine import EngineConfig
from tests.engine.helpers import HFReference
from tests.engine.test_smollm2_parity import REQUESTS, smollm2_adapters

from .test_tp_ranks import one_thread  # noqa: F401 - fixture

SIZES = dict(max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=96, block_size=8,
             max_slots=2, max_rank=8, attention_backend="torch", enable_cuda_graphs=False,
             async_scheduling=True)


def test_smollm2_on_three_tp_ranks_matches_hf(smollm2: Path, tmp_path: Path,
                                              one_thread: None) -> None:  # noqa: F811
    adapters = smollm2_adapters(smollm2, tmp_path)
    requests = REQUESTS
    new_tokens = 5
    ranks = launch_tp_ranks(TPLaunchSpec(str(smollm2), 3, device="cpu", dtype="float32",
                                         engine=EngineConfig(**SIZES), torch_threads=1,
                                         timeout_s=300.0))
    try:
        engine = ranks.engine
        group = engine.tp_group
        assert group is not None and group.size == 3 and engine.async_scheduling
        assert engine.runner.config.num_heads == 3 and engine.runner.config.num_kv_heads == 1
        handles = {n: engine.register_adapter(p) for n, p in adapters.items()}
        group.counter.reset()
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        outs = engine.generate([p for p, _ in requests], params,
                               [handles[a] if a else None for _, a in requests])
        assert engine.num_overlapped_steps > 0
        assert group.counter.calls("lora") == 0
    finally:
        ranks.shutdown(timeout_s=120.0)
    hf = HFReference(smollm2, adapters)
    for (prompt, name), out in zip(requests, outs, strict=True):
        ref, _ = hf.greedy(prompt, new_tokens, name)
        assert list(out.token_ids) == ref, name
