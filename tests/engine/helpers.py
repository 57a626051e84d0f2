"""Test helpers: hand-built single-request plans and HF reference runs (independent oracle)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dataplane.core import BatchPlan, SamplingParams

Arrivals = Sequence[tuple[list[int], str | None, int, int]]
"""(prompt, adapter name or None, max_tokens, arrival step) per request ``r{i}``."""


def serve_arrivals(engine: Any, requests: Arrivals, handles: Mapping[str, Any],
                   logprobs: int | None = None) -> dict[str, Any]:
    """Greedy requests added at their arrival steps, stepped until all finish; the
    finished outputs by request id."""
    outputs: dict[str, Any] = {}
    step = 0
    while len(outputs) < len(requests):
        for i, (prompt, adapter, max_tokens, arrival) in enumerate(requests):
            if arrival == step:
                engine.add_request(f"r{i}", prompt, SamplingParams(
                    temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                    logprobs=logprobs), handles[adapter] if adapter else None)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        step += 1
    return outputs


def plan_for_chunk(token_ids: list[int], start: int, block_table: tuple[int, ...],
                   block_size: int, slot: int = -1, sample_all: bool = False,
                   decode: bool = False) -> BatchPlan:
    """One request computing tokens [start, start + len(token_ids)) as a prefill chunk
    (or one decode row). Samples every row when `sample_all`, else the last row."""
    t = len(token_ids)
    positions = tuple(range(start, start + t))
    slots = tuple(block_table[p // block_size] * block_size + p % block_size for p in positions)
    samples = tuple(range(t)) if sample_all else (t - 1,)
    return BatchPlan(
        generation=0, input_ids=tuple(token_ids), positions=positions, row_request=(0,) * t,
        row_slot=(slot,) * t, request_ids=("r",), prefill_indptr=(0,) if decode else (0, t),
        doff=0 if decode else t, context_lens=(start + t,), block_tables=(block_table,),
        slot_mapping=slots, sample_rows=samples, sample_request_ids=("r",) * len(samples),
        block_size=block_size)


def hf_logits(model_dir: Path, token_ids: list[int], adapter_dir: Path | None = None
              ) -> torch.Tensor:
    """HF transformers (+ PEFT) fp32 logits [len, vocab] for one sequence."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


class HFReference:
    """HF transformers + PEFT, loaded once with every adapter; runs one request alone."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.model = None
        for name, path in adapters.items():
            if self.model is None:
                self.model = PeftModel.from_pretrained(base, path, adapter_name=name).eval()
            else:
                self.model.load_adapter(path, adapter_name=name)
        self.base = base

    def greedy(self, prompt: list[int], max_new_tokens: int, adapter: str | None
               ) -> tuple[list[int], torch.Tensor]:
        """(new tokens, per-step logits [n, vocab]) of greedy generate for one request."""
        import contextlib

        model = self.model if self.model is not None else self.base
        ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if self.model is not None:
            if adapter is None:
                ctx = self.model.disable_adapter()
            else:
                self.model.set_adapter(adapter)
        with torch.no_grad(), ctx:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0)
        tokens = out.sequences[0, len(prompt):].tolist()
        return tokens, torch.stack([x[0] for x in out.logits]).float()


def attach_stacked_tables(runner: Any, slots: Mapping[int, Any]) -> None:
    """Place adapters (slot -> `LoadedAdapter`) in per-projection stacked factor tables
    (`LoraFactorTable`) attached to the runner's projections, for runner tests without an
    engine: the kernels' stacked layout, independent of the engine's pool placement."""
    from dataplane.kernels import LoraFactorTable
    from dataplane.models.llama import LORA_GROUPS

    for (layer, attr), linear in runner.linears.items():
        table = LoraFactorTable(runner.max_slots, linear.in_features, linear.out_features,
                                runner.max_rank, runner.dtype, runner.device)
        adapted = False
        for slot, adapter in slots.items():
            factors = {k: (m.a, m.b, m.scale) for m in adapter.modules if m.layer == layer
                       for k, name in enumerate(LORA_GROUPS[attr]) if m.module == name}
            if factors:
                table.set_slot(slot, factors)
                adapted = True
        linear.attach_factors(table)
        linear.set_adapted(adapted)


def adapter_pages(model_dir: Path, adapters: Mapping[str, Path], block_size: int,
                  max_rank: int = 8) -> int:
    """Pages of the unified pool the adapters take together (one page = one KV block of
    `block_size` tokens): a test that wants exactly N KV blocks beside them sizes its pool
    N + this."""
    return _adapter_pages(model_dir, tuple(sorted(adapters.values())), block_size, max_rank)


@functools.lru_cache(maxsize=32)
def _adapter_pages(model_dir: Path, adapters: tuple[Path, ...], block_size: int,
                   max_rank: int) -> int:
    from dataplane.engine import EngineSpec, build_engine

    if not adapters:
        return 0
    engine = build_engine(EngineSpec.of(model_dir, num_kv_blocks=4096, block_size=block_size,
                                        max_slots=len(adapters), max_rank=max_rank,
                                        enable_cuda_graphs=False))
    for path in adapters:
        engine.register_adapter(path)
    return int(engine.pool.pool.pages.counts().adapter)


class FrequencyPresence:
    """HF logits processor: logit -= frequency x count(token in output) + presence x
    [count > 0], in float64 (HF has no such processor; written from the definition)."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.double().clone()
        for row in range(out.shape[0]):
            counts: dict[int, int] = {}
            for t in input_ids[row, self.prompt_len:].tolist():
                counts[t] = counts.get(t, 0) + 1
            for t, c in counts.items():
                out[row, t] -= self.frequency * c + self.presence
        return out.to(scores.dtype)


def hf_generate(model: Any, prompt: list[int], adapter: str | None, p: SamplingParams,
                eos: int) -> list[int]:
    """Greedy HF `generate` of one request under `p`'s logit adjustments, in the engine's
    order: HF's SequenceBias (logit_bias), MinNewTokensLength (min_tokens), RepetitionPenalty,
    then FrequencyPresence. `model` is a PeftModel (adapter None: adapters disabled)."""
    import contextlib

    from transformers import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    stops = [*p.stop_token_ids, *([] if p.ignore_eos else [eos])]
    procs: list[Any] = []
    if p.logit_bias:
        procs.append(SequenceBiasLogitsProcessor([[[t], b] for t, b in p.logit_bias]))
    if p.min_tokens:
        procs.append(MinNewTokensLengthLogitsProcessor(len(prompt), p.min_tokens, stops))
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.frequency_penalty or p.presence_penalty:
        procs.append(FrequencyPresence(len(prompt), p.frequency_penalty, p.presence_penalty))
    ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if adapter is None:
        ctx = model.disable_adapter()
    else:
        model.set_adapter(adapter)
    with torch.no_grad(), ctx:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=p.max_tokens,
                             do_sample=False, logits_processor=LogitsProcessorList(procs),
                             eos_token_id=stops or None, pad_token_id=0)
    return list(out[0, len(prompt):].tolist())
