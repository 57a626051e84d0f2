"""Fixtures: a tiny random Llama and three real PEFT adapters (different ranks and targets)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dataplane.assets import make_peft_adapter, make_tiny_llama

if not torch.cuda.is_available():  # Triton kernels run in the interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

ADAPTER_SPECS = {
    # name: (seed, rank, alpha, target_modules, extra kwargs)
    "attn_r4": dict(seed=11, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "all_r8": dict(seed=12, rank=8, alpha=16,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                   "up_proj", "down_proj"],
                   rank_pattern={"down_proj": 2}, alpha_pattern={"o_proj": 4}),
    "mlp_rs2": dict(seed=13, rank=2, alpha=4, target_modules=["gate_proj", "down_proj"],
                    use_rslora=True),
}


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-adapters")
    return {name: make_peft_adapter(tiny_llama, root / name, **spec)  # type: ignore[arg-type]
            for name, spec in ADAPTER_SPECS.items()}


@pytest.fixture(autouse=True)
def _single_torch_thread() -> Iterator[None]:
    """One intra-op thread: on the shared 2-core CI box, OpenMP spin-waiting across
    contended cores makes small GEMMs ~8x slower with 2 threads. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
