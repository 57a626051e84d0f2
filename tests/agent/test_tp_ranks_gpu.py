"""Two GPUs: the agent's TP ranks with CUDA graphs give the eager TP=2 and the TP=1 greedy
tokens; decode steps are replayed from graphs and prefill steps from piecewise graphs; also
with the LoRA folded into the base GEMMs (`lora_fold`). Skipped without two CUDA devices."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from agent.tp_ranks import TPLaunchSpec, launch_tp_ranks
from dataplane.engine import EngineConfig, EngineSpec, build_engine

from .test_tp_ranks import SIZES, assets, greedy, one_thread  # noqa: F401 - fixtures

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

GPU_SIZES = {**SIZES, "attention_backend": "triton"}


def tp2_tokens(base: Path, adapters: dict[str, Path], graphs: bool, fold: bool = False
               ) -> tuple[list[tuple[int, ...]], int, int]:
    sizes = {**GPU_SIZES, "enable_cuda_graphs": graphs}
    start = time.perf_counter()

    def stage(name: str) -> None:  # shown with -s: where a slow or stuck run spent its time
        print(f"tp2 graphs={graphs} fold={fold}: {name} at "
              f"{time.perf_counter() - start:.1f} s", flush=True)

    ranks = launch_tp_ranks(TPLaunchSpec(str(base), 2, device="cuda", dtype="float32",
                                         engine=EngineConfig(**sizes),
                                         lora_fold="on" if fold else "off",
                                         timeout_s=300.0))
    stage("ranks up")
    assert ranks.engine.model.lora_fold_rows == (GPU_SIZES["max_num_seqs"] if fold else 0)
    try:
        tokens = greedy(ranks.engine, adapters)
        replays = getattr(ranks.engine.runner.graphs, "replays", 0)
        piece_runs = getattr(ranks.engine.runner.piecewise, "runs", 0)
        stage("generated")
    finally:
        ranks.shutdown(timeout_s=120.0)
        stage("shut down")
    # released before the NCCL group was left
    assert ranks.engine.runner.graphs is None and ranks.engine.runner.piecewise is None
    return tokens, replays, piece_runs


def test_tp2_graphs_equal_eager_and_tp1(assets: tuple[Path, dict[str, Path]],  # noqa: F811
                                        one_thread: None) -> None:  # noqa: F811
    base, adapters = assets
    reference = greedy(build_engine(EngineSpec.of(base, dtype="float32", device="cuda",
                                             **{**GPU_SIZES, "enable_cuda_graphs": False})),
                       adapters)
    eager, eager_replays, eager_pieces = tp2_tokens(base, adapters, graphs=False)
    graphed, replays, pieces = tp2_tokens(base, adapters, graphs=True)
    folded, fold_replays, _ = tp2_tokens(base, adapters, graphs=True, fold=True)
    assert eager_replays == eager_pieces == 0 and replays > 0 and pieces > 0
    assert fold_replays > 0
    assert graphed == eager == reference
    assert folded == reference
