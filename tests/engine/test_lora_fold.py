"""The single-GPU engine's LoRA fold (`EngineConfig.lora_fold`): the fold slots hold what
the pool's pages hold for the adapters a step uses, least recently used out, through
loads and unloads; with fewer fold slots than adapters the engine still matches HF + PEFT;
the fold is refused where it cannot stay in step. (Token parity with HF + PEFT under the
fold, one fold slot per table slot: test_engine_parity.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.core import InvalidRequest
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import AdapterError
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.kernels.errors import LoraSlotError
from dataplane.layers.lora_fold_slots import SHRINK_WINDOW
from tests.kernels.fold_checks import assert_fold_holds

from .helpers import HFReference, serve_arrivals
from .test_engine_parity import REQUESTS

SIZES = dict(dtype="float32", device="cpu", max_num_seqs=2, max_num_batched_tokens=16,
             num_kv_blocks=144, block_size=4, max_slots=3, max_rank=8)


def test_fold_slots_follow_steps_loads_and_unloads(tiny_llama: Path,
                                                   tiny_adapters: dict[str, Path]) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, lora_fold=True, **SIZES))  # type: ignore[arg-type]
    runner, slots = engine.runner, engine.model.lora_fold_slots
    assert slots is not None and engine.model.lora_fold_rows == 2
    assert slots.fold_slots == 2  # min(3 table slots, 2 rows per folded step)
    pairs = [(engine.pool.tables.weights(*key), linear.fold)
             for key, linear in runner.linears.items()]
    handles = [engine.register_adapter(path) for path in tiny_adapters.values()]
    a, b, c = (h.slot for h in handles)
    for _table, store in pairs:  # nothing is copied in before a step needs it
        assert store is not None and not store.weight_aug[store.base_rows:].any()
    assert slots.rows([a, -1, b, a]) == [0, -1, 1, 0] and slots.copied == 2
    assert slots.rows([c]) == [0]  # a is the least recently used: c takes its fold slot
    assert (slots.holder(a), slots.holder(b), slots.holder(c)) == (-1, 1, 0)
    assert slots.rows([b, c]) == [1, 0] and slots.copied == 3  # both held: no copy
    for table, store in pairs:
        assert store is not None
        assert_fold_holds(store, table, 0, c)
        assert_fold_holds(store, table, 1, b)
    with pytest.raises(LoraSlotError, match="uses 3 adapters"):
        slots.rows([a, b, c])
    assert (slots.holder(a), slots.copied) == (-1, 3)  # the refused step changed nothing
    engine.unregister_adapter(handles[2])  # c's fold slot empties with its pool slot
    assert slots.holder(c) == -1 and slots.holder(b) == 1
    again = engine.register_adapter(tiny_adapters["mlp_rs2"])
    assert again.slot == c  # the pool slot comes back; the next step copies it in again
    assert slots.rows([c]) == [0] and slots.copied == 4
    for table, store in pairs:
        assert store is not None
        assert_fold_holds(store, table, 0, c)


def test_fewer_fold_slots_than_adapters_match_hf_peft(tiny_llama: Path,
                                                      tiny_adapters: dict[str, Path]) -> None:
    """Two fold slots, three adapters and base rows: decode steps keep copying adapters in
    over the least recently used one, and every request still gets HF + PEFT's tokens."""
    engine = build_engine(EngineSpec.of(tiny_llama, lora_fold=True, **SIZES))  # type: ignore[arg-type]
    handles = {name: engine.register_adapter(path) for name, path in tiny_adapters.items()}
    outputs = serve_arrivals(engine, REQUESTS, handles)
    slots = engine.model.lora_fold_slots
    assert slots is not None and slots.copied > len(handles)  # adapters were evicted
    hf = HFReference(tiny_llama, tiny_adapters)
    for i, (prompt, adapter, max_tokens, _arrival) in enumerate(REQUESTS):
        ref_tokens, _ = hf.greedy(prompt, max_tokens, adapter)
        assert list(outputs[f"r{i}"].token_ids) == ref_tokens, f"request r{i} ({adapter})"


def test_fold_is_refused_after_loads_or_without_slots(tiny_llama: Path,
                                                      tiny_adapters: dict[str, Path]) -> None:
    engine = build_engine(EngineSpec.of(tiny_llama, **SIZES))  # type: ignore[arg-type]
    engine.register_adapter(tiny_adapters["attn_r4"])
    with pytest.raises(AdapterError, match="before loading adapters"):
        engine.pool.enable_fold()
    assert all(linear.fold is None for linear in engine.runner.linears.values())
    no_lora = build_engine(EngineSpec.of(tiny_llama, **{**SIZES, "max_slots": 0}))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="LoRA slots"):
        no_lora.pool.enable_fold()


def test_fold_width_grows_shrinks_and_relocates(tiny_llama: Path,
                                                tiny_adapters: dict[str, Path]) -> None:
    """Three fold slots in widths of one: a step reads only the fold slots below its
    highest one; the capacity grows with a step's adapters and, after `SHRINK_WINDOW` steps
    needing fewer, shrinks — dropping what it held above, copying a live adapter down."""
    engine = build_engine(EngineSpec.of(tiny_llama, **{**SIZES, "max_num_seqs": 3}))  # type: ignore[arg-type]
    engine.pool.enable_fold(width_unit=1)
    runner, slots = engine.runner, engine.model.lora_fold_slots
    assert slots is not None and slots.widths == (1, 2, 3) and slots.capacity == 1
    pairs = [(engine.pool.tables.weights(*key), linear.fold)
             for key, linear in runner.linears.items()]
    a, b, c = (engine.register_adapter(p).slot for p in tiny_adapters.values())
    assert slots.rows([a, -1]) == [0, -1] and slots.step_width == 1
    assert slots.rows([b, a]) == [1, 0] and (slots.capacity, slots.step_width) == (2, 2)
    assert slots.rows([a]) == [0] and slots.step_width == 1  # b is held, not read
    assert slots.rows([b]) == [1] and slots.step_width == 2
    assert slots.rows([c, a, b]) == [2, 0, 1] and slots.capacity == 3
    copied = slots.copied
    for _ in range(SHRINK_WINDOW - 1):  # the three-adapter step is still in the window
        slots.rows([b])
    assert slots.capacity == 3 and slots.copied == copied
    assert slots.rows([b]) == [0] and (slots.capacity, slots.step_width) == (1, 1)
    assert slots.copied == copied + 1  # b moved down from fold slot 1 into 0
    assert (slots.holder(a), slots.holder(b), slots.holder(c)) == (-1, 0, -1)
    for table, store in pairs:
        assert store is not None
        assert_fold_holds(store, table, 0, b)
    assert slots.width_steps[1] > 0 and slots.width_steps[2] > 0 and slots.width_steps[3] > 0


def test_fold_widths_under_decode_graphs_match_hf_peft(tiny_llama: Path,
                                                       tiny_adapters: dict[str, Path]) -> None:
    """Decode steps through `CudaGraphRunner` (eagerly on CPU), one graph per batch size
    and fold width: steps read one, two or three fold slots' `A` as their adapters need,
    and every request still gets HF + PEFT's tokens."""
    engine = build_engine(EngineSpec.of(tiny_llama, **{**SIZES, "max_num_seqs": 3}))  # type: ignore[arg-type]
    engine.pool.enable_fold(width_unit=1)
    graphs = CudaGraphRunner(engine.runner, 3, 64, batch_sizes=(1, 2), run_eagerly=True)
    assert graphs.fold_widths(3) == (1, 2, 3)
    engine.runner.graphs = graphs
    handles = {name: engine.register_adapter(path) for name, path in tiny_adapters.items()}
    outputs = serve_arrivals(engine, REQUESTS, handles)
    slots = engine.model.lora_fold_slots
    assert slots is not None and graphs.replays > 0
    assert sum(1 for n in slots.width_steps.values() if n) >= 2
    hf = HFReference(tiny_llama, tiny_adapters)
    for i, (prompt, adapter, max_tokens, _arrival) in enumerate(REQUESTS):
        ref_tokens, _ = hf.greedy(prompt, max_tokens, adapter)
        assert list(outputs[f"r{i}"].token_ids) == ref_tokens, f"request r{i} ({adapter})"
