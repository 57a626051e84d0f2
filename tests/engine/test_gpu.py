"""GPU tests (marked `gpu`, skipped without CUDA): fp32 parity with CUDA graphs and the
Triton LoRA backend, bf16 logits within dtype tolerance, graph replay == eager.

Run on the device: `python -m pytest tests/engine -m gpu`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.engine import Engine
from tests.kernels.lora_cases import enable_folded_silu

from .helpers import HFReference

pytestmark = pytest.mark.gpu

REQUESTS = [([5, 17, 33, 9, 100, 7, 250, 3, 64], "all_r8"), ([1, 2, 3], None),
            ([9, 9, 9, 31, 200], "attn_r4"), ([60, 61, 62, 63, 64, 65], "mlp_rs2"),
            ([3, 141, 59], "attn_r4")]
MAX_TOKENS = 8


def _generate(model_dir: Path, adapters: dict[str, Path], dtype: str, graphs: bool,
              lora_fold: str = "off", max_num_seqs: int = 8) -> tuple[Engine, list]:
    engine = build_engine(EngineSpec.of(model_dir, dtype=dtype, device="cuda",
                                   max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=64, num_kv_blocks=64, block_size=4,
                                   max_slots=4, max_rank=8, enable_cuda_graphs=graphs,
                                   lora_fold=lora_fold, scheduling_policy="fcfs"))
    handles = {n: engine.register_adapter(p) for n, p in adapters.items()}
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = engine.generate([p for p, _ in REQUESTS], params,
                           [handles[a] if a else None for _, a in REQUESTS])
    return engine, outs


@pytest.mark.parametrize("fused", ["1", "0", "lora-fold", "lora-fold-1"],
                         ids=["fused-decode", "two-kernel-folded-silu", "lora-fold",
                              "lora-fold-one-slot"])
def test_fp32_cuda_graphs_match_hf(cuda_device: torch.device, tiny_llama: Path,
                                   tiny_adapters: dict[str, Path], fused: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every LoRA path: the fused decode launch, two kernels everywhere (gate/up's expand
    folded into SiLU·mul), and the LoRA folded into the base GEMMs and their consumer
    ops for decode steps (`lora_fold`, captured in the decode graphs) — also with one
    request at a time, so the fold holds one adapter and copies the next request's in
    (one batched launch) between graph replays."""
    fold = fused.startswith("lora-fold")
    monkeypatch.setenv("ADAPTERPLANE_LORA_FUSED", "1" if fold else fused)
    if fused == "0":
        enable_folded_silu(monkeypatch)
    engine, outs = _generate(tiny_llama, tiny_adapters, "float32", graphs=True,
                             lora_fold="on" if fold else "off",
                             max_num_seqs=1 if fused == "lora-fold-1" else 8)
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.replays > 0  # type: ignore[attr-defined]
    stores = [linear.fold for linear in engine.runner.linears.values()]
    assert all((store is not None and store.uses > 0) if fold else store is None
               for store in stores)
    slots = engine.model.lora_fold_slots
    if fused == "lora-fold-1":  # fcfs: all_r8, (base), attn_r4, mlp_rs2, attn_r4 again
        assert slots is not None and slots.batched and slots.fold_slots == 1
        assert slots.copied == 4
    hf = HFReference(tiny_llama, tiny_adapters)
    for (prompt, name), out in zip(REQUESTS, outs, strict=True):
        ref_tokens, ref_logits = hf.greedy(prompt, MAX_TOKENS, name)
        assert list(out.token_ids) == ref_tokens, name
        ref_lp = ref_logits.log_softmax(-1)
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        want = ref_lp[torch.arange(MAX_TOKENS), torch.tensor(ref_tokens)]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_bf16_logprobs_within_dtype_tolerance(cuda_device: torch.device, tiny_llama: Path,
                                              tiny_adapters: dict[str, Path]) -> None:
    """Teacher-forced on the engine's own tokens: our bf16 error against the fp32 HF+PEFT
    reference is no worse than HF+PEFT's own bf16 error (plus a small margin)."""
    _, outs = _generate(tiny_llama, tiny_adapters, "bfloat16", graphs=True)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf32 = HFReference(tiny_llama, tiny_adapters)
    base16 = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).cuda()
    peft16 = None
    for n, p in tiny_adapters.items():
        if peft16 is None:
            peft16 = PeftModel.from_pretrained(base16, p, adapter_name=n).eval()
        else:
            peft16.load_adapter(p, adapter_name=n)
    assert peft16 is not None
    for (prompt, name), out in zip(REQUESTS, outs, strict=True):
        seq = torch.tensor([prompt + list(out.token_ids)])
        steps = torch.arange(len(prompt) - 1, seq.shape[1] - 1)
        targets = seq[0, steps + 1]
        with torch.no_grad():
            if name is None:
                with hf32.model.disable_adapter():  # type: ignore[union-attr]
                    ref = hf32.model(seq).logits[0].float()  # type: ignore[union-attr]
                with peft16.disable_adapter():
                    h16 = peft16(seq.cuda()).logits[0].float().cpu()
            else:
                hf32.model.set_adapter(name)  # type: ignore[union-attr]
                ref = hf32.model(seq).logits[0].float()  # type: ignore[union-attr]
                peft16.set_adapter(name)
                h16 = peft16(seq.cuda()).logits[0].float().cpu()
        ref_lp = ref.log_softmax(-1)[steps, targets]
        hf16_lp = h16.log_softmax(-1)[steps, targets]
        ours = torch.tensor([lp.logprob for lp in out.logprobs])
        hf_err = (hf16_lp - ref_lp).abs().max().item()
        our_err = (ours - ref_lp).abs().max().item()
        assert our_err <= 2 * hf_err + 2e-2, (name, our_err, hf_err)


def test_graph_replay_equals_eager_bf16(cuda_device: torch.device, tiny_llama: Path,
                                        tiny_adapters: dict[str, Path]) -> None:
    engine, with_graphs = _generate(tiny_llama, tiny_adapters, "bfloat16", graphs=True)
    assert engine.runner.graphs.replays > 0  # type: ignore[union-attr]
    _, eager = _generate(tiny_llama, tiny_adapters, "bfloat16", graphs=False)
    assert [o.token_ids for o in with_graphs] == [o.token_ids for o in eager]
    for g, e in zip(with_graphs, eager, strict=True):
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in g.logprobs]),
                                   torch.tensor([lp.logprob for lp in e.logprobs]),
                                   atol=1e-2, rtol=1e-2)


def test_fused_ops_match_torch_ops_fp32_on_cuda(cuda_device: torch.device, tiny_llama: Path,
                                                tiny_adapters: dict[str, Path]) -> None:
    """The fused Triton elementwise ops (default on CUDA) against their torch references,
    CUDA graphs on: same greedy tokens, logprobs within fp32 tolerance."""
    outs = {}
    for ops in ("triton", "torch"):
        engine = build_engine(EngineSpec.of(tiny_llama, dtype="float32", device="cuda",
                                       max_num_seqs=8, max_num_batched_tokens=64,
                                       num_kv_blocks=64, block_size=4, max_slots=4,
                                       max_rank=8, ops_backend=ops))
        handles = {n: engine.register_adapter(p) for n, p in tiny_adapters.items()}
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                logprobs=0)
        outs[ops] = engine.generate([p for p, _ in REQUESTS], params,
                                    [handles[a] if a else None for _, a in REQUESTS])
        assert engine.runner.graphs.replays > 0  # type: ignore[attr-defined]
    assert [o.token_ids for o in outs["triton"]] == [o.token_ids for o in outs["torch"]]
    for g, e in zip(outs["triton"], outs["torch"], strict=True):
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in g.logprobs or ()]),
                                   torch.tensor([lp.logprob for lp in e.logprobs or ()]),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_async_scheduling_matches_sync_with_cuda_graphs(cuda_device: torch.device,
                                                        tiny_llama: Path,
                                                        tiny_adapters: dict[str, Path],
                                                        dtype: str) -> None:
    """Async scheduling (default with graphs) vs the synchronous loop: identical tokens for
    greedy (+ logprobs), seeded sampling and a stop token that fires mid-batch."""
    def run(async_on: bool) -> tuple[Engine, list]:
        engine = build_engine(EngineSpec.of(tiny_llama, dtype=dtype, device="cuda", max_num_seqs=8,
                                       max_num_batched_tokens=64, num_kv_blocks=64,
                                       block_size=4, max_slots=4, max_rank=8,
                                       async_scheduling=async_on))
        assert engine.async_scheduling is async_on
        handles = {n: engine.register_adapter(p) for n, p in tiny_adapters.items()}
        params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1),
                  SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=12,
                                 ignore_eos=True),
                  SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                 stop_token_ids=stops),
                  SamplingParams(temperature=0.7, top_k=20, seed=8, max_tokens=5,
                                 ignore_eos=True, logprobs=0),
                  SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)]
        outs = engine.generate([p for p, _ in REQUESTS], params,
                               [handles[a] if a else None for _, a in REQUESTS])
        assert engine.runner.graphs.replays > 0  # type: ignore[attr-defined]
        pages = engine.pool.pool.pages.counts()  # every KV page back; the adapters' stay
        assert engine.block_manager.num_free_blocks == pages.total - pages.adapter
        return engine, outs

    stops: tuple[int, ...] = ()
    _, probe = run(False)
    toks = probe[2].token_ids
    stops = (next((t for i, t in enumerate(toks) if i >= 4 and t not in toks[:i]), toks[0]),)
    _, sync = run(False)
    engine, asyn = run(True)
    assert engine.num_overlapped_steps > 0
    assert sync[2].finish_reason == "stop" and len(sync[2].token_ids) < 12
    for s, a in zip(sync, asyn, strict=True):
        assert a.token_ids == s.token_ids and a.finish_reason == s.finish_reason
        torch.testing.assert_close(torch.tensor([lp.logprob for lp in a.logprobs or ()]),
                                   torch.tensor([lp.logprob for lp in s.logprobs or ()]),
                                   atol=1e-2 if dtype == "bfloat16" else 1e-4, rtol=1e-2)


def _compiled_variants() -> dict[str, int]:
    """Compiled variants per LoRA / metadata kernel (Triton's per-device kernel caches)."""
    from dataplane.kernels.triton import (
        expand_kernel,
        expand_silu_kernel,
        fused_kernel,
        lora_kernels,
        meta_blocked,
        meta_kernel,
    )

    fns = [lora_kernels.lora_shrink_kernel, expand_kernel.lora_expand_kernel,
           expand_silu_kernel.lora_expand_silu_kernel,
           fused_kernel.lora_fused_kernel, meta_kernel._build_meta_sort_kernel,
           meta_blocked._block_hist_kernel, meta_blocked._block_scatter_kernel]
    return {fn.__name__: sum(len(c[0]) for c in fn.device_caches.values()) for fn in fns}


def test_warm_up_compiles_every_eager_lora_variant(cuda_device: torch.device, tiny_llama: Path,
                                                   tiny_adapters: dict[str, Path]) -> None:
    """After the engine's warm-up, steps of any row count (odd ones, mixed prefill and
    decode, every adapter; the first step has 570 rows: blocked metadata, two kernels)
    compile no LoRA kernel: no served step waits on Triton's JIT."""
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="bfloat16", device="cuda", max_num_seqs=8,
                                   max_num_batched_tokens=600, num_kv_blocks=512, block_size=4,
                                   max_slots=4, max_rank=8))
    handles = [engine.register_adapter(p) for p in tiny_adapters.values()]
    before = _compiled_variants()
    assert before["lora_fused_kernel"] and before["_build_meta_sort_kernel"], before
    lengths = (3, 77, 231, 240, 19)
    prompts = [[(7 * i + j) % 250 + 1 for j in range(n)] for i, n in enumerate(lengths)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outs = engine.generate(prompts, params, [handles[i % len(handles)] for i in range(5)])
    assert all(len(o.token_ids) == 5 for o in outs)
    assert _compiled_variants() == before


def _attention_variants() -> dict[str, int]:
    """Compiled variants of the Triton attention kernels (decode, its split combine,
    varlen prefill)."""
    from dataplane.attention import triton_decode, triton_prefill

    fns = [triton_decode._paged_decode_kernel, triton_decode._combine_kernel,
           triton_prefill._varlen_prefill_kernel]
    return {fn.__name__: sum(len(c[0]) for c in fn.device_caches.values()) for fn in fns}


def test_warm_up_compiles_every_decode_attention_variant(cuda_device: torch.device,
                                                         tiny_llama: Path) -> None:
    """A step's decode rows choose the context-split count, so a run's shrinking tail (128
    rows down to 1, contexts over several block-table width classes) launches split counts
    its full steps never did: after the engine's warm-up none of them compiles."""
    engine = build_engine(EngineSpec.of(tiny_llama, dtype="bfloat16", device="cuda",
                                        max_num_seqs=128, max_num_batched_tokens=1024,
                                        num_kv_blocks=4096, block_size=4, max_slots=0,
                                        max_rank=8))
    before = _attention_variants()
    assert before["_paged_decode_kernel"] > 0, before
    for i in range(128):
        prompt = [(11 * i + j) % 250 + 1 for j in range(5 + (i * 7) % 90)]
        engine.add_request(f"r{i}", prompt, SamplingParams(
            temperature=0, max_tokens=1 + (i * 13) % 48, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    after = _attention_variants()
    decode = ("_paged_decode_kernel", "_combine_kernel")
    assert {k: after[k] for k in decode} == {k: before[k] for k in decode}, (before, after, steps)
