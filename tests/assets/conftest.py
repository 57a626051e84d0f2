from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.assets import make_tiny_llama


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny Llama, seed 0, shared by the assets tests."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-base"), seed=0)
