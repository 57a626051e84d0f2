"""Shared fixtures: a tiny base, its ABI, and one real PEFT adapter made by peft itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.artifacts import BaseModelABI, read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama

TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("base"), seed=0)


@pytest.fixture(scope="session")
def base_abi(base_dir: Path) -> BaseModelABI:
    return read_base_abi(base_dir)


@pytest.fixture(scope="session")
def valid_adapter(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp32, r=4 alpha=8 on q/v/down of both layers; v_proj r=2 via rank_pattern."""
    return make_peft_adapter(base_dir, tmp_path_factory.mktemp("valid"), seed=11, rank=4,
                             alpha=8, target_modules=TARGETS, rank_pattern={"v_proj": 2})
