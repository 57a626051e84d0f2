"""`prefill_after`: n samples of one prompt prefill it once; the others wait for it and
read its full blocks from the prefix cache, with outputs equal to each request run alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import Engine, RequestOutput

PROMPT = [(7 * i + 3) % 250 + 3 for i in range(41)]  # 10 full blocks of 4, and one token


def _engine(model_dir: Path, async_on: bool = False) -> Engine:
    return build_engine(EngineSpec.of(model_dir, dtype="float32", device="cpu", max_num_seqs=8,
                                      max_num_batched_tokens=256, num_kv_blocks=96,
                                      block_size=4, max_slots=2, max_rank=8,
                                      async_scheduling=async_on))


def _params(k: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, seed=100 + k, max_tokens=6, ignore_eos=True)


def _run(engine: Engine, chained: bool) -> dict[str, RequestOutput]:
    for k in range(4):
        engine.add_request(f"s{k}", PROMPT, _params(k),
                           prefill_after="s0" if chained and k else None)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


@pytest.mark.parametrize("async_on", [False, True])
def test_n_samples_prefill_the_prompt_once(tiny_llama: Path, async_on: bool) -> None:
    alone = {}
    for k in range(4):
        engine = _engine(tiny_llama)
        engine.add_request("x", PROMPT, _params(k))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    alone[f"s{k}"] = out.token_ids
    together = _run(_engine(tiny_llama, async_on), chained=False)
    assert [together[f"s{k}"].num_cached_tokens for k in range(4)] == [0, 0, 0, 0]
    chained = _run(_engine(tiny_llama, async_on), chained=True)
    assert chained["s0"].num_cached_tokens == 0
    assert [chained[f"s{k}"].num_cached_tokens for k in (1, 2, 3)] == [40, 40, 40]
    for k in range(4):
        assert chained[f"s{k}"].token_ids == together[f"s{k}"].token_ids == alone[f"s{k}"]
    assert len({chained[f"s{k}"].token_ids for k in range(4)}) > 1  # seeds differ


def test_a_gone_or_unknown_leader_does_not_hold_anyone(tiny_llama: Path) -> None:
    engine = _engine(tiny_llama)
    engine.add_request("lead", PROMPT, _params(0))
    engine.add_request("f", PROMPT, _params(1), prefill_after="lead")
    engine.add_request("g", PROMPT, _params(2), prefill_after="nobody")
    assert engine.abort("lead")
    first = {out.request_id for out in engine.step()}
    assert {"f", "g"} <= first  # both admitted in the first step
