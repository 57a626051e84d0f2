"""Tiny Llama assets for merged-release tests: one base (and a second, different one),
PEFT adapters covering rank_pattern / alpha_pattern, rsLoRA and an activated LoRA."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.merges.registry import Registry


@dataclass(frozen=True)
class MergeAssets:
    base: Path
    other_base: Path
    patterned: Path
    """q/v/down, rank 4 with v_proj rank 2 (rank_pattern), down_proj alpha 3 (alpha_pattern)."""
    rslora: Path
    """q/o, rank 8, alpha 16, use_rslora."""
    plain: Path
    """q/v, rank 2, alpha 4."""
    alora: Path
    other: Path
    """An adapter of `other_base`."""


@pytest.fixture(scope="session")
def merge_assets(tmp_path_factory: pytest.TempPathFactory) -> MergeAssets:
    from dataplane.assets import make_peft_adapter, make_tiny_llama

    root = tmp_path_factory.mktemp("merge-assets")
    base = make_tiny_llama(root / "base", seed=0)
    other_base = make_tiny_llama(root / "other-base", seed=1, intermediate_size=96)
    patterned = make_peft_adapter(base, root / "patterned", seed=1, rank=4, alpha=8,
                                  target_modules=["q_proj", "v_proj", "down_proj"],
                                  rank_pattern={"v_proj": 2}, alpha_pattern={"down_proj": 3})
    rslora = make_peft_adapter(base, root / "rslora", seed=2, rank=8, alpha=16,
                               target_modules=["q_proj", "o_proj"], use_rslora=True)
    plain = make_peft_adapter(base, root / "plain", seed=3, rank=2, alpha=4,
                              target_modules=["q_proj", "v_proj"])
    alora = make_peft_adapter(base, root / "alora", seed=4, rank=2, alpha=4,
                              target_modules=["q_proj", "v_proj"], alora_invocation_tokens=[5, 6])
    other = make_peft_adapter(other_base, root / "other", seed=5, rank=2, alpha=4,
                              target_modules=["q_proj"])
    return MergeAssets(base, other_base, patterned, rslora, plain, alora, other)


@pytest.fixture
def registry(tmp_path: Path, merge_assets: MergeAssets) -> Iterator[Registry]:
    """An embedded registry with a validated adapter and its fp32 merged release."""
    from tests.merges.registry import open_registry

    with open_registry(tmp_path, merge_assets) as reg:
        yield reg
