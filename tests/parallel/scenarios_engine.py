"""Rank-side half of test_tp_engine.py: the same engine on one device and as TP ranks.

Every rank builds the one-device reference engine over the whole model and its TP engine
over its shard. The leader registers both adapters (each rank's pool gets its shard),
generates greedily, unloads adapter 1 and loads it again (its slot is unpublished and
republished on every rank), and generates again; the followers `serve()` until the
leader shuts down. Returns the reference's and the leader's outputs, the collectives of
the first generate, and what each rank holds.
"""

from __future__ import annotations

from typing import Any

from dataplane.engine import Engine
from dataplane.engine.adapters import AdapterHandle
from dataplane.parallel import TPGroup
from dataplane.sampling_params import SamplingParams

from .tp_setup import NEW_TOKENS, REQUESTS, global_adapters, rank_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)


def generate(engine: Engine, handles: list[AdapterHandle]) -> dict[str, Any]:
    outs = engine.generate([p for p, _ in REQUESTS], GREEDY,
                           [None if a < 0 else handles[a] for _, a in REQUESTS])
    return {"tokens": [list(o.token_ids) for o in outs],
            "logprobs": [[lp.logprob for lp in o.logprobs or ()] for o in outs]}


def run(group: TPGroup, payload: dict[str, Any]) -> dict[str, Any]:
    adapters = global_adapters(rank_engine(None).model.config)
    engine = rank_engine(group, lora_fold=payload["fold"])
    out: dict[str, Any] = {"kv_heads_local": engine.model.config.num_kv_heads,
                           "k_weight": engine.model.layers[0].qkv_proj.weight[
                               engine.model.config.q_size:][
                               :engine.model.config.kv_size].clone(),
                           "folds": engine.model.lora_fold_slots is not None}
    if group.rank != 0:
        out["plans"] = engine.serve()
        out["pages_written"] = [int(engine.pool.pool.storage.data[p].abs().sum() > 0)
                                for p in range(engine.pool.layout.total_pages)]
        return out
    reference = rank_engine(None, lora_fold=payload["fold"])
    ref_handles = [reference.register_loaded_adapter(a) for a in adapters]
    out["reference"] = generate(reference, ref_handles)
    handles = [engine.register_loaded_adapter(a) for a in adapters]
    group.counter.reset()
    out["tp"] = generate(engine, handles)
    out["base_calls"] = group.counter.calls("base")
    out["lora_calls"] = group.counter.calls("lora")
    engine.unregister_adapter(handles[1])
    handles[1] = engine.register_loaded_adapter(adapters[1])
    out["again"] = generate(engine, handles)
    out["slots"] = [h.slot for h in handles]
    engine.shutdown()
    return out
