"""The fused launch's config table: shape classes and tuned-file loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataplane.kernels.triton import configs


def test_llama_modules_fall_in_their_shape_classes() -> None:
    assert configs.fused_shape(4096, (4096, 1024, 1024)) == "qkv"
    assert configs.fused_shape(4096, (4096,)) == "square"
    assert configs.fused_shape(4096, (14336, 14336)) == "wide"
    assert configs.fused_shape(14336, (4096,)) == "deep"
    assert configs.fused_shape(576, (1536, 1536)) == "wide"  # SmolLM2 gate/up
    assert configs.fused_shape(1536, (576,)) == "deep"


def test_tuned_file_installs_entries_and_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(configs, "FUSED_TABLE", dict(configs.FUSED_TABLE))
    qkv_before = configs.fused_config(128, 16, 4096, (4096, 1024, 1024))
    tuned = configs.FusedConfig(16, 128, 32, 8, 3, per_sm=3, min_split=1, pipe=3)
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"fused": {"256/wide": tuned.__dict__}}))
    configs.load_tuned(str(path))
    got = configs.fused_config(128, 16, 4096, (14336, 14336))
    assert got is not None and (got.per_sm, got.min_split, got.pipe, got.num_warps) == (3, 1, 3, 8)
    # only the named class changed
    assert configs.fused_config(128, 16, 4096, (4096, 1024, 1024)) == qkv_before
    assert configs.fused_table_json()["256/wide"] == tuned.__dict__


@pytest.mark.parametrize(
    "fused",
    [
        {"256/wide": {"block_m": 16}},  # missing fields
        {"256/wide": {**configs.FusedConfig(16, 128, 32, 4, 3).__dict__, "bogus": 1}},
        {"512/wide": configs.FusedConfig(16, 128, 32, 4, 3).__dict__},  # no such T class
        {"256/mlp": configs.FusedConfig(16, 128, 32, 4, 3).__dict__},  # no such shape
    ],
)
def test_bad_tuned_file_raises_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fused: dict
) -> None:
    monkeypatch.setattr(configs, "FUSED_TABLE", dict(configs.FUSED_TABLE))
    before = dict(configs.FUSED_TABLE)
    good = configs.FusedConfig(16, 128, 32, 4, 3, pipe=3).__dict__
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"fused": {"64/qkv": good, **fused}}))
    with pytest.raises(ValueError):
        configs.load_tuned(str(path))
    assert before == configs.FUSED_TABLE  # the good entry was not applied either
