"""The fused launch's config table: shape classes and tuned-file loading."""

from __future__ import annotations

import dataclasses
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
    # their TP=2 shards (column-parallel q/k/v and gate/up, row-parallel o and down)
    assert configs.fused_shape(4096, (2048, 512, 512)) == "qkv"
    assert configs.fused_shape(2048, (4096,)) == "square"
    assert configs.fused_shape(4096, (7168, 7168)) == "wide"
    assert configs.fused_shape(7168, (4096,)) == "deep"


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


def test_tuned_file_installs_folded_silu_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(configs, "SILU_TABLE", dict(configs.SILU_TABLE))
    tile = configs.ExpandConfig(64, 128, 64, 8, 3, 4)
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"silu": {"4096": tile.__dict__, "1024": None}}))
    configs.load_tuned(str(path))
    assert configs.silu_config(3000, 16) == configs.ExpandConfig(64, 128, 16, 8, 3, 4)
    assert configs.silu_config(3000, 64) == tile
    assert configs.silu_config(600, 16) is None  # null: do not fold
    assert configs.silu_table_json()["4096"] == tile.__dict__


@pytest.mark.parametrize(
    "silu",
    [{"4000": None}, {"4096": {"block_m": 64}}, {"x": None}],
    ids=["no-such-class", "missing-fields", "not-a-number"],
)
def test_bad_silu_entries_raise_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silu: dict
) -> None:
    monkeypatch.setattr(configs, "FUSED_TABLE", dict(configs.FUSED_TABLE))
    monkeypatch.setattr(configs, "SILU_TABLE", dict(configs.SILU_TABLE))
    fused_before, silu_before = dict(configs.FUSED_TABLE), dict(configs.SILU_TABLE)
    good = configs.FusedConfig(16, 128, 32, 4, 3, pipe=3).__dict__
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"fused": {"64/qkv": good}, "silu": silu}))
    with pytest.raises(ValueError):
        configs.load_tuned(str(path))
    assert fused_before == configs.FUSED_TABLE and silu_before == configs.SILU_TABLE


def _run_through_fused_entry(monkeypatch: pytest.MonkeyPatch, key: tuple[int, str],
                             cfg: configs.FusedConfig, out_features: tuple[int, ...],
                             num_rows: int, none_share: float, seed: int) -> None:
    """Install ``cfg`` at ``key`` (none there before: two kernels), run a ``skewed`` step
    of ``num_rows`` rows against the float64 reference, and check it took the fused
    launch (Triton interpreter on CPU, CUDA when present)."""
    import os

    import torch

    from dataplane.kernels.triton import fused_ops
    from dataplane.kernels.triton.backend import TritonLoraBackend

    from .lora_cases import check_case, make_case

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs CUDA or the Triton interpreter")
    monkeypatch.setattr(configs, "FUSED_TABLE", dict(configs.FUSED_TABLE))
    configs.FUSED_TABLE.pop(key, None)
    assert configs.fused_config(num_rows, 16, 40, out_features) is None  # two kernels
    configs.FUSED_TABLE[key] = cfg
    launches: list[int] = []
    real = fused_ops.prepare_fused

    def counting(*args: object, **kwargs: object) -> object:
        launches.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused_ops, "prepare_fused", counting)
    case = make_case(dtype=torch.float32, in_features=40, out_features=out_features,
                     ranks=[4, 16, 9], num_rows=num_rows, dist="skewed",
                     none_share=none_share, seed=seed,
                     device="cuda" if torch.cuda.is_available() else "cpu")
    check_case(case, TritonLoraBackend(fused=True))
    assert launches  # the step went through the fused launch


@pytest.mark.parametrize("out_features", [(48,), (64, 16, 16)])
def test_fused_entry_for_mixed_steps_is_used_and_exact(
    monkeypatch: pytest.MonkeyPatch, out_features: tuple[int, ...]
) -> None:
    """A tuned fused entry for T class 1,024 (what the mixed sweep installs when it wins)
    serves a 300-row step — long single-adapter runs and one-row slots — through the
    fused launch, matching the float64 reference (Triton interpreter on CPU)."""
    shape = configs.fused_shape(40, out_features)
    _run_through_fused_entry(monkeypatch, (1024, shape),
                             configs.FusedConfig(16, 128, 32, 4, 3, pipe=3), out_features,
                             300, 0.1, 3)


def test_tall_tile_fused_entry_for_prefill_steps_is_used_and_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fused entry for T class 4,096 with 64-row tiles (what `--tune-sweeps prefillfused`
    tries) serves a 1,100-row step — one adapter's long run over many tiles beside short
    runs and rows without an adapter — matching the float64 reference."""
    _run_through_fused_entry(monkeypatch, (4096, "square"), configs.FusedConfig(
        64, 128, 8, 4, 3, per_sm=2, n_elems=8192, min_split=1, pipe=3), (48,), 1100, 0.05, 4)


def test_weighted_slice_items_follow_factor_bytes() -> None:
    """q/k/v under GQA: the q slice (4x as wide) gets more items than k and v; one slice
    or equal slices keep ``eff`` items each; the host's count is what the grid needs."""
    from dataplane.kernels.triton import fused_ops

    cfg = configs.FusedConfig(16, 128, 32, 4, 3, weighted=1)
    if fused_ops._interpreting():  # the interpreter never weights (no split may wait)
        assert fused_ops.slice_items(cfg, 2, 4096, (4096, 1024, 1024)) == 6
        return
    assert fused_ops.slice_items(cfg, 2, 4096, (4096, 1024, 1024)) == 3 + 2 + 2
    assert fused_ops.slice_items(cfg, 4, 4096, (4096,)) == 4
    assert fused_ops.slice_items(cfg, 2, 4096, (14336, 14336)) == 4


@pytest.mark.parametrize("out_features", [(24, 16, 16), (16, 16), (40,)])
def test_weighted_item_map_matches_reference(
    monkeypatch: pytest.MonkeyPatch, out_features: tuple[int, ...]
) -> None:
    """The weighted item map (slice by cumulative item counts) in the interpreter: forced
    on, with widths whose bytes round every slice to one item (no split waits), every
    slice of every row tile is computed exactly once."""
    import os

    import torch

    from dataplane.kernels.triton import fused_ops
    from dataplane.kernels.triton.backend import TritonLoraBackend

    from .lora_cases import check_case, make_case

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs CUDA or the Triton interpreter")
    monkeypatch.setattr(fused_ops, "weighted", lambda cfg: bool(cfg.weighted))
    monkeypatch.setattr(configs, "FUSED_TABLE", {
        k: dataclasses.replace(c, weighted=1) for k, c in configs.FUSED_TABLE.items()})
    plans: list[object] = []
    real = fused_ops._plan

    def spy(cfg: configs.FusedConfig, *args: object) -> object:
        plan = real(cfg, *args)  # type: ignore[arg-type]
        plans.append(plan)
        return plan

    monkeypatch.setattr(fused_ops, "_plan", spy)
    case = make_case(dtype=torch.float32, in_features=64, out_features=out_features,
                     ranks=[4, 16], num_rows=24, dist="uniform", none_share=0.2, seed=5,
                     device="cuda" if torch.cuda.is_available() else "cpu")
    check_case(case, TritonLoraBackend(fused=True))
    assert plans and all(p.constexprs["WEIGHTED"] for p in plans)  # type: ignore[attr-defined]


def test_tuned_file_installs_two_kernel_entries_and_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shrink and expand entries (what the mixed sweep writes) load from a tuned file and
    reach the configs a step of that size gets; the JSON of the tables round-trips."""
    for name in ("SHRINK_TABLE", "EXPAND_TABLE"):
        monkeypatch.setattr(configs, name, dict(getattr(configs, name)))
    shrink = configs.ShrinkConfig(64, 16, 128, 32, 4, 3, 1, False, 16, 1)
    expand = configs.ExpandConfig(16, 128, 16, 4, 3, 4, True, 1)
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"shrink": {"4096/16": shrink.__dict__},
                                "expand": {"4096/16": expand.__dict__}}))
    other = configs.shrink_entry(700, 16)
    configs.load_tuned(str(path))
    assert configs.shrink_entry(3000, 16) == shrink
    assert configs.expand_config(3000, 16) == expand
    assert configs.shrink_entry(700, 16) == other  # only the named class
    tables = configs.two_kernel_tables_json()
    assert tables["shrink"]["4096/16"] == shrink.__dict__
    assert tables["expand"]["4096/16"] == expand.__dict__


@pytest.mark.parametrize("bad", [
    {"shrink": {"4096/16": {"block_m": 64}}},  # missing fields
    {"shrink": {"4000/16": configs.ShrinkConfig(64, 16, 128, 8, 4, 3).__dict__}},  # T class
    {"expand": {"4096/12": configs.ExpandConfig(16, 128, 16, 4, 3).__dict__}},  # rank bucket
    {"expand": {"4096/16": {**configs.ExpandConfig(16, 128, 16, 4, 3).__dict__, "x": 1}}},
])
def test_bad_two_kernel_entries_raise_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: dict
) -> None:
    for name in ("SHRINK_TABLE", "EXPAND_TABLE", "FUSED_TABLE"):
        monkeypatch.setattr(configs, name, dict(getattr(configs, name)))
    before = (dict(configs.SHRINK_TABLE), dict(configs.EXPAND_TABLE), dict(configs.FUSED_TABLE))
    good = configs.FusedConfig(16, 128, 32, 4, 3, pipe=3).__dict__
    path = tmp_path / "tuned_configs.json"
    path.write_text(json.dumps({"fused": {"64/qkv": good}, **bad}))
    with pytest.raises(ValueError):
        configs.load_tuned(str(path))
    assert before == (configs.SHRINK_TABLE, configs.EXPAND_TABLE, configs.FUSED_TABLE)

