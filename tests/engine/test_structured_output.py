"""Structured output through the engine on SmolLM2 (its real tokenizer): constrained rows
(json_object, json_schema; greedy and seeded) share steps with a free row and an adapter
row; every constrained output parses and validates against its schema and finishes with
reason "stop"; the free rows' tokens equal the same requests run alone (a mask never leaks
to another row). Synchronous and with async scheduling (constrained decodes step in sync),
and with preemption (a state survives recompute)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from dataplane.core import InvalidResponseFormat, InvalidSamplingParams, ResponseFormat
from dataplane.core import SamplingParams as SP
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import Engine, RequestOutput

from .test_smollm2_parity import smollm2_adapters

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                          "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}
PROMPT = "Reply with a JSON record of a person:"


def _engine(smollm2: Path, async_on: bool, kv_blocks: int = 200) -> Engine:
    return build_engine(EngineSpec.of(smollm2, max_num_seqs=6, max_num_batched_tokens=64,
                                      num_kv_blocks=kv_blocks, block_size=8, max_slots=2,
                                      max_rank=8, async_scheduling=async_on))


def _requests(handles: dict[str, object]) -> list[tuple[str, SP, object]]:
    person = ResponseFormat.from_schema(PERSON)
    return [
        ("obj", SP(temperature=0, max_tokens=96,
                   response_format=ResponseFormat.json_object()), None),
        ("person", SP(temperature=0, max_tokens=96, response_format=person), handles["qv8"]),
        ("sampled", SP(temperature=1.0, seed=7, max_tokens=96, response_format=person), None),
        ("flag", SP(temperature=0.7, seed=3, max_tokens=32,
                    response_format=ResponseFormat.from_schema(FLAG, strict=True)), None),
        ("free", SP(temperature=0, max_tokens=12, ignore_eos=True), None),
        ("free_lora", SP(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True),
         handles["all4"]),
    ]


def _run(engine: Engine, reqs: list[tuple[str, SP, object]]) -> dict[str, RequestOutput]:
    for rid, params, handle in reqs:
        engine.add_request(rid, PROMPT, params, handle)  # type: ignore[arg-type]
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return done


@pytest.mark.parametrize(("async_on", "kv_blocks"), [(False, 200), (True, 200), (False, 30)])
def test_constrained_rows_validate_and_free_rows_are_untouched(
        smollm2: Path, tmp_path: Path, async_on: bool, kv_blocks: int) -> None:
    adapters = smollm2_adapters(smollm2, tmp_path)
    engine = _engine(smollm2, async_on, kv_blocks)
    handles = {n: engine.register_adapter(p) for n, p in adapters.items()}
    done = _run(engine, _requests(handles))
    if kv_blocks < 100:
        assert engine.num_preemptions > 0, "the KV pool was meant to force preemption"
    schemas = {"obj": {"type": "object"}, "person": PERSON, "sampled": PERSON, "flag": FLAG}
    for rid, schema in schemas.items():
        out = done[rid]
        assert out.finish_reason == "stop", (rid, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    alone = _engine(smollm2, False)
    alone_handles = {n: alone.register_adapter(p) for n, p in adapters.items()}
    for rid in ("free", "free_lora"):
        req = next(r for r in _requests(alone_handles) if r[0] == rid)
        assert done[rid].token_ids == _run(alone, [req])[rid].token_ids


def test_bad_formats_and_combinations_are_refused(smollm2: Path) -> None:
    engine = _engine(smollm2, False)
    with pytest.raises(InvalidResponseFormat):
        engine.add_request("bad", PROMPT, SP(response_format=ResponseFormat.from_schema(
            {"type": "object", "properties": {"x": {"type": "string", "minLength": 5,
                                                    "maxLength": 2}}, "required": ["x"]},
            strict=True)))
    with pytest.raises(InvalidSamplingParams, match="ignore_eos"):
        SP(ignore_eos=True, response_format=ResponseFormat.json_object())
    with pytest.raises(InvalidSamplingParams, match="min_tokens"):
        SP(min_tokens=2, response_format=ResponseFormat.json_object())
    assert not engine.has_unfinished()
