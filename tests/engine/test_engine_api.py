"""Engine API contract: typed errors that change nothing, streaming outputs, abort."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.core import InvalidRequest, SamplingParams
from dataplane.engine import EngineSpec, build_engine

SIZES = dict(max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=16, block_size=4,
             max_slots=1, max_rank=8)


def test_bad_options_are_refused(tiny_llama: Path) -> None:
    with pytest.raises(InvalidRequest, match="dtype"):
        build_engine(EngineSpec.of(tiny_llama, dtype="int8", **SIZES))
    with pytest.raises(InvalidRequest, match="unknown engine options"):
        build_engine(EngineSpec.of(tiny_llama, max_num_sequences=4))
    with pytest.raises(InvalidRequest, match="max_slots"):
        build_engine(EngineSpec.of(tiny_llama, **{**SIZES, "max_slots": -1}))


def test_bad_requests_change_nothing(tiny_llama: Path) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, **SIZES))
    with pytest.raises(InvalidRequest):
        engine.add_request("a", [1, 2, 256])  # vocab is 256
    with pytest.raises(InvalidRequest, match="tokenizer"):
        engine.add_request("a", "text needs a tokenizer")
    with pytest.raises(InvalidRequest):
        engine.add_request("a", [])
    assert not engine.has_unfinished()
    engine.add_request("a", [1, 2])
    with pytest.raises(InvalidRequest, match="duplicate"):
        engine.add_request("a", [3, 4])


def test_streaming_and_abort(tiny_llama: Path) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, **SIZES))
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine.add_request("keep", [5, 6, 7], greedy)
    engine.add_request("drop", [8, 9, 10, 11], greedy)
    seen: dict[str, list[int]] = {"keep": [], "drop": []}
    for out in engine.step():
        seen[out.request_id].extend(out.new_token_ids)
    assert engine.abort("drop") and not engine.abort("drop") and not engine.abort("nope")
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == "keep"
            seen["keep"].extend(out.new_token_ids)
            assert list(out.token_ids) == seen["keep"]
            final = out
    assert final is not None and final.finished and final.finish_reason == "length"
    assert len(seen["keep"]) == 5 and len(seen["drop"]) == 1
    assert engine.block_manager.num_free_blocks == SIZES["num_kv_blocks"]  # nothing leaked
    alone = build_engine(EngineSpec.of(tiny_llama, **SIZES)).generate([[5, 6, 7]], greedy)[0]
    assert list(alone.token_ids) == seen["keep"]
