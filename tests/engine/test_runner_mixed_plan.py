"""The model runner on mixed prefill + decode plans with several adapters in one step.

- The five-request mixed prefill/decode example (p0 prefill 3 rows adapter a, p1 prefill
  2 rows b, decodes d0 a, d1 base, d2 c): the packed plan is exactly the expected one (as
  in tests/core/test_batch_plan.py), and each sampled row's logits equal HF + PEFT's for
  that request alone (adapter runs that cross `doff` never merge attention).
- Base rows get an exactly zero LoRA delta: bitwise equal to a LoRA-disabled runner.
- The CUDA-graph input path (padding, device-built metadata), run eagerly on CPU, equals
  the eager path and writes no KV slot but the plan's and the trash slot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.artifacts import read_base_abi
from dataplane.core import Sequence, build_batch_plan
from dataplane.engine.adapters import load_peft_adapter
from dataplane.engine.cuda_graphs import CudaGraphRunner
from dataplane.engine.model_runner import ModelRunner
from dataplane.models import load_model

from .helpers import HFReference, attach_stacked_tables

BS = 4
SLOTS = {"a": 0, "b": 1, "c": 2}
NAMES = {"a": "attn_r4", "b": "all_r8", "c": "mlp_rs2"}
TOL = dict(atol=2e-5, rtol=1e-4)


def _runner(model_dir: Path, adapters: dict[str, Path], max_slots: int = 3,
            attention: str = "torch") -> ModelRunner:
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, num_kv_blocks=32, block_size=BS, max_rows=64,
                         max_slots=max_slots, max_rank=8, attention_backend=attention)
    if max_slots:
        abi = read_base_abi(model_dir)
        attach_stacked_tables(runner, {
            slot: load_peft_adapter(adapters[NAMES[key]], abi, max_rank=8)
            for key, slot in SLOTS.items()})
    return runner


class _Blocks:
    def __init__(self) -> None:
        self.next = 3  # start away from 0 so block ids differ from row indices

    def give(self, seq: Sequence, tokens: int) -> None:
        while len(seq.block_table) * BS < tokens:
            seq.block_table.append(self.next)
            self.next += 2  # scattered


def _seq(rid: str, prompt: list[int], key: str | None) -> Sequence:
    slot = -1 if key is None else SLOTS[key]
    return Sequence(rid, tuple(prompt), adapter_slot=slot,
                    adapter_digest=None if key is None else "0" * 64)


def _mixed_step(runner: ModelRunner, adapters: bool = True
                ) -> tuple[list[Sequence], torch.Tensor, object]:
    """The five-request example's step (after warming the decodes' caches); with `adapters=False`
    every request runs the base model (no row has a slot)."""
    blocks = _Blocks()

    def key(k: str) -> str | None:
        return k if adapters else None

    d0 = _seq("d0", [9, 8, 7, 6, 5, 4], key("a"))
    d1 = _seq("d1", [20, 21, 22, 23, 24, 25, 26, 27, 28], None)
    d2 = _seq("d2", [100, 3], key("c"))
    for d in (d0, d1, d2):  # earlier step: everything but the last token is in the cache
        blocks.give(d, d.num_tokens)
        warm = build_batch_plan([(d, d.num_tokens - 1)], [], block_size=BS, generation=1)
        runner.execute(warm)
        d.num_computed_tokens = d.num_tokens - 1
    p0 = _seq("p0", [11, 12, 13], key("a"))
    p1 = _seq("p1", [40, 41], key("b"))
    for p in (p0, p1):
        blocks.give(p, p.num_tokens)
    plan = build_batch_plan([(p0, 3), (p1, 2)], [d0, d1, d2], block_size=BS, generation=2)
    return [p0, p1, d0, d1, d2], runner.execute(plan), plan


def test_mixed_example_plan_matches_each_request_alone(tiny_llama: Path,
                                                      tiny_adapters: dict[str, Path]) -> None:
    runner = _runner(tiny_llama, tiny_adapters)
    seqs, logits, plan = _mixed_step(runner)
    a, b, c = SLOTS["a"], SLOTS["b"], SLOTS["c"]
    assert plan.prefill_indptr == (0, 2, 5) and plan.doff == 5  # type: ignore[attr-defined]
    assert plan.row_slot == (b, b, a, a, a, a, -1, c)  # type: ignore[attr-defined]
    assert plan.sample_rows == (4, 1, 5, 6, 7)  # type: ignore[attr-defined]
    hf = HFReference(tiny_llama, tiny_adapters)
    keys = {"p0": "a", "p1": "b", "d0": "a", "d1": None, "d2": "c"}
    for seq, row in zip(seqs, logits, strict=True):
        key = keys[seq.request_id]
        _, ref = hf.greedy(list(seq.token_ids), 1, NAMES[key] if key else None)
        torch.testing.assert_close(row, ref[0], **TOL)


def test_base_rows_get_exactly_zero_delta(tiny_llama: Path,
                                          tiny_adapters: dict[str, Path]) -> None:
    runner = _runner(tiny_llama, tiny_adapters)
    _, with_lora, plan = _mixed_step(runner)
    _, without, plan_base = _mixed_step(runner, adapters=False)
    assert all(s < 0 for s in plan_base.row_slot)  # type: ignore[attr-defined]
    i = plan.sample_request_ids.index("d1")  # type: ignore[attr-defined]
    j = plan_base.sample_request_ids.index("d1")  # type: ignore[attr-defined]
    assert torch.equal(with_lora[i], without[j])
    assert not torch.allclose(with_lora[0], without[0])  # adapter rows do change


@pytest.mark.parametrize("ops", ["torch", "triton"])
@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_graph_input_path_equals_eager(tiny_llama: Path, tiny_adapters: dict[str, Path],
                                       attention: str, ops: str) -> None:
    """Triton = the paged decode kernel / the fused elementwise ops (interpreted on CPU);
    the eager reference is always the torch gather path with the torch ops."""
    runner = _runner(tiny_llama, tiny_adapters, attention=attention)
    runner.model.set_ops_backend(ops)
    blocks = _Blocks()
    seqs = [_seq("x", [1, 2, 3, 4, 5], "b"), _seq("y", [7] * 9, None), _seq("z", [3, 4], "c")]
    for s in seqs:
        blocks.give(s, s.num_tokens)
        runner.execute(build_batch_plan([(s, s.num_tokens - 1)], [], block_size=BS,
                                        generation=1))
        s.num_computed_tokens = s.num_tokens - 1
    plan = build_batch_plan([], seqs, block_size=BS, generation=2)
    graphs = CudaGraphRunner(runner, max_batch=8, max_context=64, batch_sizes=(1, 2, 4, 8))
    k_before = runner.cache.k.clone()
    padded = graphs.run_padded(plan)  # 3 rows padded to 4, context bucket 64
    changed = (runner.cache.k != k_before).any(dim=-1).any(dim=-1).nonzero()[:, 1].unique()
    allowed = set(plan.slot_mapping) | {runner.cache.trash_slot}
    assert set(changed.tolist()) <= allowed
    runner.decode_kernel = "torch"
    runner.model.set_ops_backend("torch")
    eager = runner.execute(plan)
    torch.testing.assert_close(padded, eager, **TOL)
