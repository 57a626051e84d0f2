"""agent/tp_ranks.py: the agent (rank 0) drives a two-rank gloo TP group of real engines.

Reference: the single-device `Engine` (no dataplane.parallel code) on the same tiny Llama
checkpoint and the same real PEFT adapters; TP=2 must give the same greedy tokens for base
requests and for adapters of two ranks/targets, add no LoRA collective, and keep the
follower in lockstep (it executes every plan rank 0 executes and holds its shard of every
adapter in its own pool, at the pages rank 0's pool chose).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agent.tp_ranks import TPLaunchSpec, launch_tp_ranks
from dataplane.artifacts import read_base_abi, validate_peft_dir
from dataplane.assets import make_peft_adapter, make_tiny_llama
from dataplane.core import SamplingParams
from dataplane.engine import Engine, EngineConfig, EngineSpec, build_engine
from dataplane.parallel.layout_identity import tp_kernel_local_identity
from dataplane.parallel.shard import COLUMN, ROW

SIZES = dict(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64, block_size=4,
             max_slots=2, max_rank=8, attention_backend="torch", enable_cuda_graphs=False)
PROMPTS = [[5, 17, 33, 8, 61, 90], [5, 17, 33, 8, 61, 90], [70, 3, 44], [70, 3, 44, 12, 9]]
ADAPTERS = {"attn_r4": dict(seed=21, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
            "all_r8": dict(seed=22, rank=8, alpha=16,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj"])}
WHICH = [None, "all_r8", "attn_r4", "all_r8"]  # request i's adapter
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("tp-ranks")
    base = make_tiny_llama(root / "base", seed=3)
    return base, {name: make_peft_adapter(base, root / name, **spec)  # type: ignore[arg-type]
                  for name, spec in ADAPTERS.items()}


@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def greedy(engine: Engine, adapters: dict[str, Path]) -> list[tuple[int, ...]]:
    handles = {name: engine.register_adapter(path) for name, path in adapters.items()}
    outs = engine.generate(PROMPTS, PARAMS, [None if w is None else handles[w] for w in WHICH])
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("tp_size", [2, 4])
def test_gloo_ranks_match_tp1_greedy(assets: tuple[Path, dict[str, Path]],
                                     one_thread: None, tp_size: int) -> None:
    """TP=2 splits the tiny model's two kv heads; TP=4 replicates each on two ranks."""
    base, adapters = assets
    reference = greedy(build_engine(EngineSpec.of(base, dtype="float32", device="cpu", **SIZES)),
                       adapters)
    assert reference[0] != reference[1]  # the adapter changes the tokens: parity not vacuous
    assert all(len(t) == PARAMS.max_tokens for t in reference)

    ranks = launch_tp_ranks(TPLaunchSpec(str(base), tp_size, device="cpu", dtype="float32",
                                         engine=EngineConfig(**SIZES), torch_threads=1,
                                         timeout_s=120.0))
    try:
        engine = ranks.engine
        group = engine.tp_group
        assert group is not None and ranks.tp_size == tp_size and group.rank == 0
        assert engine.runner.config.num_kv_heads == 1  # 2 kv heads: split, or replicated
        assert engine.pool.max_slots == SIZES["max_slots"]  # the shards live in the pool
        group.counter.reset()
        assert greedy(engine, adapters) == reference
        counter = group.counter
        assert counter.calls("lora") == 0
        assert counter.calls("base") > 0
        # plans and loads went to the followers as control broadcasts (2 calls each)
        assert counter.calls("control", "broadcast") >= 2 * (len(adapters) + 2)
        # every published slot records each rank's H_kernel_local from the votes
        for path in adapters.values():
            handle = engine.register_adapter(path)  # the same handle again
            assert engine.adapters.kernel_local[handle.slot] == \
                expected_kernel_local(base, path, handle.digest, tp_size)
        # unload on every rank, then a fresh load into the freed slot: same tokens again
        gone = engine.register_adapter(adapters["all_r8"])
        engine.unregister_adapter(gone)
        assert gone.slot not in engine.adapters.kernel_local
        assert greedy(engine, adapters) == reference
    finally:
        ranks.shutdown(timeout_s=60.0)


def expected_kernel_local(base: Path, adapter: Path, semantic: str, tp_size: int
                          ) -> tuple[str, ...]:
    """Each rank's H_kernel_local for the validated artifact at `adapter`, built here from
    its specs: q/k/v B in whole heads of 16, and at TP=4 the tiny model's two kv heads
    shared by two ranks each; the shards are paged in each rank's pool."""
    specs = sorted(validate_peft_dir(adapter, read_base_abi(base)).modules,
                   key=lambda m: m.name)
    column = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    styles = {s.name: COLUMN if s.role in column else ROW for s in specs}
    heads = {s.name: 16 for s in specs if s.role in ("q_proj", "k_proj", "v_proj")}
    kv = {s.name for s in specs if s.role in ("k_proj", "v_proj")} if tp_size > 2 else set()
    return tuple(tp_kernel_local_identity(
        adapter_semantic=semantic, kernel_family="torch", conversion_revision=1,
        dtype="float32", packing="paged", specs=specs, styles=styles, tp_rank=j,
        tp_size=tp_size, out_units=heads, replicated=kv).h_kernel_local
        for j in range(tp_size))


MIXED_PARAMS = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=8,
                               ignore_eos=True),
                SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                SamplingParams(temperature=1.1, seed=11, max_tokens=8, ignore_eos=True)]


def sampled(engine: Engine, adapters: dict[str, Path]) -> list[tuple[int, ...]]:
    handles = {name: engine.register_adapter(path) for name, path in adapters.items()}
    outs = engine.generate(PROMPTS, MIXED_PARAMS,
                           [None if w is None else handles[w] for w in WHICH])
    return [o.token_ids for o in outs]


@pytest.mark.parametrize(("lora_fold", "max_num_seqs"), [(False, 8), (True, 8), (True, 1)],
                         ids=["launches", "fold", "fold-one-slot"])
def test_async_tp2_matches_sync_tp1(assets: tuple[Path, dict[str, Path]],
                                    one_thread: None, lora_fold: bool,
                                    max_num_seqs: int) -> None:
    """Async scheduling on the TP leader: decode steps are launched before the previous
    step's tokens reach the host, the follower gets them by one device broadcast per
    continuation step, and the tokens (greedy and seeded sampling) equal the synchronous
    single-device engine's — also with the LoRA folded into the base GEMMs (`lora_fold`:
    every decode step folds on both ranks), and with one request at a time the folds hold
    one adapter, copied in again on both ranks whenever the next request's differs."""
    base, adapters = assets
    # arrival order, so one-at-a-time requests change adapters as listed (the fair policy's
    # cost vector would run the same adapter's requests together)
    sizes = {**SIZES, "max_num_seqs": max_num_seqs, "scheduling_policy": "fcfs"}
    reference = sampled(build_engine(EngineSpec.of(base, dtype="float32", device="cpu",
                                              **{**sizes, "async_scheduling": False})),
                        adapters)
    ranks = launch_tp_ranks(TPLaunchSpec(str(base), 2, device="cpu", dtype="float32",
                                         engine=EngineConfig(**{**sizes, "async_scheduling": True}),
                                         lora_fold="on" if lora_fold else "off", torch_threads=1,
                                         timeout_s=120.0))
    try:
        engine = ranks.engine
        group = engine.tp_group
        assert group is not None and engine.async_scheduling
        assert engine.model.lora_fold_rows == (max_num_seqs if lora_fold else 0)
        group.counter.reset()
        assert sampled(engine, adapters) == reference
        fold_slots = engine.model.lora_fold_slots
        if lora_fold:  # one fold slot, three adapter changes between requests
            assert fold_slots is not None and fold_slots.fold_slots == min(2, max_num_seqs)
            assert fold_slots.copied == (3 if max_num_seqs == 1 else 2)
        assert engine.num_overlapped_steps > 0
        # one token broadcast per overlapped step, nothing else new; no LoRA collective
        assert group.counter.calls("tokens") == engine.num_overlapped_steps
        assert group.counter.calls("lora") == 0
    finally:
        ranks.shutdown(timeout_s=60.0)


def test_agent_build_engine_launches_tp_ranks(assets: tuple[Path, dict[str, Path]],
                                              one_thread: None) -> None:
    """`tp_degree=2` in the agent's settings: agent_engine spawns the follower and returns
    rank 0's engine, metrics subscribed, whose greedy tokens equal the single-device
    engine's."""
    from agent.config import AgentSettings
    from agent.engine_factory import agent_engine
    from agent.metrics import AgentMetrics
    from agent.plan_metrics import PlanMetrics

    base, adapters = assets
    small = {k: SIZES[k] for k in ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks",
                                   "block_size", "max_slots", "max_rank")}
    reference = greedy(build_engine(EngineSpec.of(base, dtype="float32", device="cpu", **small)),
                       adapters)
    settings = AgentSettings(model_dir=base, device="cpu", dtype="float32",
                             tp_degree=2, piecewise_graphs=False, **small)
    engine, ranks = agent_engine(settings, AgentMetrics())
    assert ranks is not None
    try:
        assert engine.tp_group is not None and engine.tp_group.size == 2
        assert any(isinstance(o, PlanMetrics) for o in engine.observers)
        assert engine.config.enable_piecewise_graphs is False  # the agent's setting reaches it
        assert greedy(engine, adapters) == reference
    finally:
        ranks.shutdown(timeout_s=60.0)


def test_a_shard_one_rank_fails_to_validate_is_published_on_no_rank(
        assets: tuple[Path, dict[str, Path]], one_thread: None) -> None:
    """Rank 1's validation of its shard fails (an injected fault): every rank votes on the
    outcome, nothing is published, the refusal names rank 1's cause, rank 0's pool takes
    the slot back, and the engine keeps serving the base model exactly as before; the next
    load (the fault fired once) is published on both ranks and changes the tokens."""
    from dataplane.engine.adapters import AdapterError

    base, adapters = assets
    ranks = launch_tp_ranks(TPLaunchSpec(str(base), 2, device="cpu", dtype="float32",
                                         engine=EngineConfig(**SIZES), torch_threads=1,
                                         timeout_s=120.0, faults={0: "", 1: "validate=fail"}))
    try:
        engine = ranks.engine
        before = engine.generate([PROMPTS[2]], PARAMS)[0].token_ids
        with pytest.raises(AdapterError, match=r"not published.*ranks \[1\] failed"):
            engine.register_adapter(adapters["attn_r4"])
        assert engine.adapters.bound() == {}
        assert engine.generate([PROMPTS[2]], PARAMS)[0].token_ids == before
        handle = engine.register_adapter(adapters["attn_r4"])
        assert engine.generate([PROMPTS[2]], PARAMS, [handle])[0].token_ids != before
    finally:
        ranks.shutdown(timeout_s=60.0)


def test_tp_devices_start_at_the_agents_gpu(assets: tuple[Path, dict[str, Path]]) -> None:
    """`cuda:N` puts rank r on GPU N + r (several TP agents per node); a device the ranks
    cannot have is refused before any process starts, with a typed error."""
    from agent.tp_ranks import first_cuda_index
    from dataplane.parallel.errors import ProcessGroupError

    assert first_cuda_index("cpu") is None
    assert first_cuda_index("cuda") == 0
    assert first_cuda_index("cuda:6") == 6
    for bad in ("cuda:", "cuda:x", "mps", "cuda:1:2"):
        with pytest.raises(ProcessGroupError, match="unknown TP device"):
            first_cuda_index(bad)
    visible = torch.cuda.device_count()
    spec = TPLaunchSpec(str(assets[0]), 2, device=f"cuda:{visible}", dtype="float32",
                        engine=EngineConfig(**SIZES))
    with pytest.raises(ProcessGroupError, match=f"needs GPUs {visible}..{visible + 1}"):
        launch_tp_ranks(spec)


def test_watch_is_silent_through_a_normal_shutdown(assets: tuple[Path, dict[str, Path]],
                                                    one_thread: None) -> None:
    """`TPRanks.watch` reports follower exits while the group is up (the agent then exits,
    tests/agent/test_tp_agent_process.py); the exits `shutdown()` causes are not losses."""
    import threading

    ranks = launch_tp_ranks(TPLaunchSpec(str(assets[0]), 2, device="cpu", dtype="float32",
                                         engine=EngineConfig(**SIZES), torch_threads=1))
    lost = threading.Event()
    assert len(ranks.follower_pids()) == 1
    ranks.watch(lambda _reason: lost.set())
    ranks.shutdown(timeout_s=60.0)
    assert not lost.wait(1.0)
