"""GPU: the engine's unified pool on CUDA (marked `gpu`, skipped without CUDA).

One unified pool on the device holds KV blocks and adapter factors in one buffer (the
engine's KV cache is page-major views of the pool's pages; dataplane/engine/pool_slots.py);
adapters are loaded by the pool's transactions (copy on a side stream + event, on-device
validation, generation-stamped publication) and every LoRA linear reads the pool's
address tables. Greedy tokens and logprobs must equal HF transformers + PEFT (fp32), for a
mixed batch of base rows and three adapters, decode steps replayed from CUDA graphs
captured after the linears were pointed at the pool; then a hot swap (unload + reload into a new
slot generation) and a full drain leave the pool conserved with no KV pages held. With
the LoRA fold (`PoolSlots.enable_fold`, dataplane/pool/fold_source.py) the captured decode
steps read fold slots filled from the pages by the batched copy, and the same holds.

Lives here (not tests/agent) so it runs on the device without the control-plane test
dependencies; run with `python -m pytest tests/engine/test_pool_slots_gpu.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.core import SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import AdapterError, load_peft_adapter
from dataplane.engine.engine import Engine

from .helpers import HFReference

pytestmark = pytest.mark.gpu

REQUESTS = [([5, 17, 33, 9, 100, 7, 250, 3, 64], "all_r8"), ([1, 2, 3], None),
            ([9, 9, 9, 31, 200], "attn_r4"), ([60, 61, 62, 63, 64, 65], "mlp_rs2"),
            ([3, 141, 59], "attn_r4")]
MAX_TOKENS = 8
PAGES = 96


def _pool_engine(model_dir: Path, fold: bool) -> Engine:
    engine = build_engine(EngineSpec.of(model_dir, device="cuda", max_num_seqs=8,
                                        max_num_batched_tokens=64, num_kv_blocks=PAGES,
                                        block_size=4, max_slots=4, max_rank=8,
                                        lora_fold="on" if fold else "off"))
    assert engine.runner.graphs is not None  # captured after the linears read the pool
    return engine


@pytest.mark.parametrize("fold", [False, True], ids=["launches", "fold"])
def test_pool_resident_adapters_match_hf_on_cuda(cuda_device: torch.device, tiny_llama: Path,
                                                 tiny_adapters: dict[str, Path],
                                                 fold: bool) -> None:
    engine = _pool_engine(tiny_llama, fold)
    slots = engine.pool
    abi = engine.base_abi
    assert abi is not None
    handles = {name: engine.register_loaded_adapter(load_peft_adapter(path, abi, 8), key=name)
               for name, path in tiny_adapters.items()}
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)

    def run() -> list:
        return engine.generate([p for p, _ in REQUESTS], params,
                               [handles[a] if a else None for _, a in REQUESTS])

    hf = HFReference(tiny_llama, tiny_adapters)
    refs = [hf.greedy(prompt, MAX_TOKENS, name) for prompt, name in REQUESTS]
    assert refs[2][0] != hf.greedy(REQUESTS[2][0], MAX_TOKENS, None)[0]  # adapter matters
    for (_, name), out, (ref_tokens, ref_logits) in zip(REQUESTS, run(), refs, strict=True):
        assert list(out.token_ids) == ref_tokens, name
        want = ref_logits.log_softmax(-1)[torch.arange(MAX_TOKENS), torch.tensor(ref_tokens)]
        got = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    # hot swap: a new slot generation for attn_r4; the stale handle is refused
    old = handles["attn_r4"]
    engine.unregister_adapter(old)
    handles["attn_r4"] = engine.register_loaded_adapter(
        load_peft_adapter(tiny_adapters["attn_r4"], abi, 8), key="attn_r4")
    assert (handles["attn_r4"].slot, handles["attn_r4"].slot_generation) != \
        (old.slot, old.slot_generation)
    with pytest.raises(AdapterError, match=r"stale"):
        engine.add_request("stale", [1, 2, 3], params, old)
    outs = run()
    assert [list(o.token_ids) for o in outs] == [tokens for tokens, _ in refs]

    graphs = engine.runner.graphs
    assert graphs is not None and graphs.replays > 0  # type: ignore[attr-defined]
    held = engine.model.lora_fold_slots
    if fold:  # the swap's new slot was copied in again, by the batched copy
        assert held is not None and held.batched and held.copied > len(handles)
        assert all(linear.fold is not None and linear.fold.uses > 0
                   for _l, _a, linear in engine.model.lora_linears())
    else:
        assert held is None
    counts = slots.pool.check()  # conservation, every page in exactly one state
    assert counts.free + counts.reserved + counts.adapter + counts.kv == PAGES
    assert engine.block_manager.num_held_blocks == counts.kv
    # one buffer: every layer's K/V views lie inside the pool's storage
    base, size = slots.pool.storage.backing.data_ptr(), slots.pool.storage.backing.nbytes
    for t in (engine.runner.cache.k, engine.runner.cache.v):
        assert t.untyped_storage().data_ptr() == slots.pool.storage.backing.untyped_storage(
        ).data_ptr()
        assert base <= t.data_ptr() < base + size
