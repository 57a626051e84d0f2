"""A tiny random Llama and four real PEFT adapters adapting the same modules (ranks 2–4)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dataplane.assets import make_peft_adapter, make_tiny_llama

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TARGETS = ["q_proj", "v_proj", "down_proj"]
MEMBERS = {f"m{i}": dict(seed=40 + i, rank=rank, alpha=2 * rank, target_modules=TARGETS)
           for i, rank in enumerate([4, 2, 4, 3])}


@pytest.fixture(scope="session")
def collection_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("collection-base"), seed=3)


@pytest.fixture(scope="session")
def collection_members(collection_base: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> list[Path]:
    root = tmp_path_factory.mktemp("collection-members")
    return [make_peft_adapter(collection_base, root / name, **spec)  # type: ignore[arg-type]
            for name, spec in MEMBERS.items()]
