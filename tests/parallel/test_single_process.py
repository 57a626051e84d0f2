"""Shard slicing, cost-model decisions and H_kernel_local records (no process group)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from dataplane.engine.adapters import ModuleFactors
from dataplane.identity import SPLIT_INPUT, SPLIT_OUTPUT, ModuleSpec, tp_local_layout
from dataplane.models import ModelConfig
from dataplane.parallel import (
    COLUMN,
    LAYOUT_LOCAL,
    LAYOUT_PAPER,
    ROW,
    IndivisibleShardError,
    ModuleTraffic,
    ProcessGroupError,
    ShardShapeError,
    UnknownLayoutError,
    decide_layout,
    init_tp_group_from_env,
    shard_lora_factors,
)
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.cost_model import SMALL_COLLECTIVE_S
from dataplane.parallel.layout_identity import (
    local_factor_scalars,
    lora_local_layout,
    schedule_of,
    tp_contract_digest,
    tp_kernel_local_identity,
)
from dataplane.parallel.llama_tp import (
    auto_lora_layouts,
    group_peft_modules,
    layout_choices,
    local_config,
)
from dataplane.parallel.shard import shard_interval
from dataplane.parallel.vocab import vocab_part

HEX = "0" * 63 + "1"


def spec(name: str, d_out: int, d_in: int, rank: int) -> ModuleSpec:
    return ModuleSpec(name=name, role=name.rsplit(".", 1)[-1], base_shape=(d_out, d_in),
                      rank=rank, alpha=Fraction(rank * 2), scaling_rule="alpha/r",
                      dtype="float16", a_sha256=HEX, b_sha256=HEX)


@pytest.mark.parametrize("style", [COLUMN, ROW])
@pytest.mark.parametrize("layout", [LAYOUT_LOCAL, LAYOUT_PAPER])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_shards_recompose_the_global_update(style: str, layout: str, n: int) -> None:
    """float64: concatenated (column) / summed (row) per-rank deltas equal s X A^T B^T."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    a = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    b = torch.randn(12, 4, generator=gen, dtype=torch.float64)
    want = 0.5 * (x @ a.T) @ b.T
    parts = [shard_lora_factors(a, b, 0.5, style=style, layout=layout, tp_rank=j, tp_size=n)
             for j in range(n)]
    if style == COLUMN:
        # paper: z = concat_j (x A_j^T); default: A whole on every rank
        z = torch.cat([x @ f.a.T for f in parts], 1) if layout == LAYOUT_PAPER else x @ a.T
        got = torch.cat([f.scale * z @ f.b.T for f in parts], 1)
    else:
        xs = torch.chunk(x, n, dim=1)
        if layout == LAYOUT_PAPER:  # z = sum_j x_j A_j^T; disjoint output slices
            z = sum((xj @ f.a.T for xj, f in zip(xs, parts, strict=True)),
                    torch.zeros(5, 4, dtype=torch.float64))
            got = torch.cat([f.scale * z @ f.b.T for f in parts], 1)
        else:  # sum_j (x_j A_j^T) B^T
            got = sum((f.scale * (xj @ f.a.T) @ f.b.T for xj, f in zip(xs, parts, strict=True)),
                      torch.zeros(5, 12, dtype=torch.float64))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_shard_errors_are_typed_and_checked_first() -> None:
    a, b = torch.zeros(3, 8), torch.zeros(8, 3)
    with pytest.raises(IndivisibleShardError) as err:
        shard_lora_factors(a, b, 1.0, style=COLUMN, layout=LAYOUT_PAPER, tp_rank=0, tp_size=2)
    assert err.value.code == "indivisible_shard"
    with pytest.raises(ShardShapeError):
        shard_lora_factors(a, torch.zeros(8, 4), 1.0, style=ROW, layout=LAYOUT_LOCAL,
                           tp_rank=0, tp_size=2)
    with pytest.raises(UnknownLayoutError):
        shard_lora_factors(a, b, 1.0, style=ROW, layout="replicate_all", tp_rank=0,
                           tp_size=2)
    with pytest.raises(IndivisibleShardError):  # kv heads split on head boundaries only
        shard_lora_factors(torch.zeros(2, 8), torch.zeros(4, 2), 1.0, style=COLUMN,
                           layout=LAYOUT_LOCAL, tp_rank=0, tp_size=2, out_unit=4)


def traffic(style: str, **kw: int) -> ModuleTraffic:
    base = {"d_in": 4096, "d_out": 4096, "num_slices": 1, "rank": 16, "tp_size": 2,
            "tokens": 64, "active_adapters": 16, "resident_adapters": 128}
    base.update(kw)
    return ModuleTraffic(style=style, **base)


def test_cost_model_prefers_no_extra_collectives_at_8b_decode() -> None:
    for style in (COLUMN, ROW):
        d = decide_layout(traffic(style))
        assert d.layout == LAYOUT_LOCAL
        assert d.paper_time_s >= SMALL_COLLECTIVE_S > d.local_time_s


def test_cost_model_goes_paper_when_replication_exceeds_budget() -> None:
    m = traffic(COLUMN)
    # (N-1)/N * r * d_in * 2 bytes * 128 resident adapters
    assert decide_layout(m, extra_resident_budget_bytes=None).layout == LAYOUT_LOCAL
    need = Fraction(16 * 4096 * 2 * 128, 2)
    assert decide_layout(m).local_extra_resident_bytes == need
    assert decide_layout(m, extra_resident_budget_bytes=int(need)).layout == LAYOUT_LOCAL
    assert decide_layout(m, extra_resident_budget_bytes=int(need) - 1).layout == LAYOUT_PAPER


def test_cost_model_goes_paper_when_replicated_reads_dominate() -> None:
    # a huge row-parallel projection with thousands of distinct adapters per step
    d = decide_layout(traffic(ROW, d_out=65536, rank=64, active_adapters=4096, tokens=4096))
    assert d.layout == LAYOUT_PAPER and d.local_time_s > d.paper_time_s


def test_cost_model_never_splits_an_indivisible_rank_or_tp1() -> None:
    assert decide_layout(traffic(COLUMN, rank=5), extra_resident_budget_bytes=0).layout \
        == LAYOUT_LOCAL
    assert decide_layout(traffic(ROW, tp_size=1)).paper_extra_calls == 0


def test_layout_records_name_their_schedule_and_count_scalars() -> None:
    q = spec("model.layers.0.self_attn.q_proj", 64, 32, 8)
    o = spec("model.layers.0.self_attn.o_proj", 32, 64, 8)
    for s, style in ((q, COLUMN), (o, ROW)):
        for layout in (LAYOUT_LOCAL, LAYOUT_PAPER):
            rec = lora_local_layout(s, style=style, layout=layout, tp_rank=1, tp_size=2)
            assert schedule_of(rec) == (style, layout)
    # the default layouts are exactly identity.tp_local_layout's SPLIT_OUTPUT / SPLIT_INPUT
    assert lora_local_layout(q, style=COLUMN, layout=LAYOUT_LOCAL, tp_rank=1, tp_size=2) \
        == tp_local_layout(q, tp_rank=1, tp_size=2, split=SPLIT_OUTPUT)
    assert lora_local_layout(o, style=ROW, layout=LAYOUT_LOCAL, tp_rank=1, tp_size=2) \
        == tp_local_layout(o, tp_rank=1, tp_size=2, split=SPLIT_INPUT)
    paper_q = lora_local_layout(q, style=COLUMN, layout=LAYOUT_PAPER, tp_rank=1, tp_size=2)
    assert local_factor_scalars(q, paper_q) == 4 * 32 + 32 * 8  # A [r/2, d_in], B [d_out/2, r]


def test_h_kernel_local_changes_with_the_chosen_layout_and_rank() -> None:
    q = spec("model.layers.0.self_attn.q_proj", 64, 32, 8)
    o = spec("model.layers.0.self_attn.o_proj", 32, 64, 8)

    def ident(q_layout: str, rank: int) -> str:
        return tp_kernel_local_identity(
            adapter_semantic=HEX, kernel_family="torch", conversion_revision=1,
            dtype="float16", packing="stacked", specs=[q, o],
            choices={q.name: (COLUMN, q_layout), o.name: (ROW, LAYOUT_LOCAL)},
            tp_rank=rank, tp_size=2).h_kernel_local

    digests = {ident(lay, r) for lay in (LAYOUT_LOCAL, LAYOUT_PAPER) for r in (0, 1)}
    assert len(digests) == 4
    with pytest.raises(UnknownLayoutError):
        tp_kernel_local_identity(adapter_semantic=HEX, kernel_family="torch",
                                 conversion_revision=1, dtype="float16", packing="stacked",
                                 specs=[q, o], choices={q.name: (COLUMN, LAYOUT_LOCAL)},
                                 tp_rank=0, tp_size=2)


def test_vocab_parts_cover_the_vocab_once() -> None:
    for v, n in ((10, 2), (11, 2), (7, 4)):
        parts = [vocab_part(v, j, n) for j in range(n)]
        covered = [i for start, stop, _ in parts for i in range(start, stop)]
        assert covered == list(range(v))
        assert len({p for _, _, p in parts}) == 1


def test_single_rank_group_collectives_are_identities() -> None:
    g = TPGroup(rank=0, size=1, device=torch.device("cpu"))
    t = torch.arange(4.0)
    assert g.all_reduce(t, purpose="base") is t
    assert torch.equal(g.all_gather(t, purpose="lora"), t[None])
    assert g.counter.calls() == 0


def test_auto_layouts_for_an_8b_shape() -> None:
    config = ModelConfig.from_dict({
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0})
    decode = auto_lora_layouts(config, 2, rank=16, tokens=64, active_adapters=16,
                               resident_adapters=128)
    assert {d.layout for d in decode.values()} == {LAYOUT_LOCAL}
    tight = auto_lora_layouts(config, 2, rank=16, tokens=64, active_adapters=16,
                              resident_adapters=128, extra_resident_budget_bytes=1 << 20)
    assert {d.layout for d in tight.values()} == {LAYOUT_PAPER}


def test_contract_digest_binds_layout_choices_not_rank() -> None:
    base = {"a.q_proj": (COLUMN, LAYOUT_LOCAL), "a.o_proj": (ROW, LAYOUT_LOCAL)}
    changed = {**base, "a.o_proj": (ROW, LAYOUT_PAPER)}
    assert tp_contract_digest(HEX, 2, base) == tp_contract_digest(HEX, 2, dict(base))
    assert tp_contract_digest(HEX, 2, base) != tp_contract_digest(HEX, 2, changed)
    assert tp_contract_digest(HEX, 2, base) != tp_contract_digest(HEX, 4, base)


def test_process_group_from_env_is_validated() -> None:
    with pytest.raises(ProcessGroupError) as err:
        init_tp_group_from_env({"RANK": "0"})
    assert err.value.code == "process_group_invalid"
    with pytest.raises(ProcessGroupError):
        init_tp_group_from_env({"RANK": "2", "WORLD_SIZE": "2"}, device="cpu")
    group = init_tp_group_from_env({"RANK": "0", "WORLD_SIZE": "1"}, device="cpu")
    assert (group.rank, group.size, group.group) == (0, 1, None)


def test_peft_modules_group_into_fused_slices() -> None:
    a, b = torch.zeros(4, 8), torch.zeros(8, 4)
    mods = [ModuleFactors(layer=1, module="v_proj", a=a, b=b, scale=0.5),
            ModuleFactors(layer=1, module="q_proj", a=a, b=b, scale=0.5),
            ModuleFactors(layer=0, module="up_proj", a=a, b=b, scale=2.0)]
    grouped = group_peft_modules(mods)
    assert sorted(grouped) == [(0, "gate_up_proj"), (1, "qkv_proj")]
    assert sorted(grouped[(1, "qkv_proj")]) == [0, 2]
    assert list(grouped[(0, "gate_up_proj")]) == [1]
    with pytest.raises(ShardShapeError):
        group_peft_modules([ModuleFactors(layer=0, module="lm_head", a=a, b=b, scale=1.0)])


def test_layout_choices_follow_the_fused_projection() -> None:
    q = spec("model.layers.0.self_attn.q_proj", 64, 32, 8)
    down = spec("model.layers.3.mlp.down_proj", 32, 64, 8)
    choices = layout_choices([q, down], {"qkv_proj": LAYOUT_PAPER})
    assert choices == {q.name: (COLUMN, LAYOUT_PAPER), down.name: (ROW, LAYOUT_LOCAL)}
    with pytest.raises(ShardShapeError):
        layout_choices([spec("model.embed_tokens", 8, 8, 8)], {})


@pytest.mark.parametrize(("heads", "tp", "want"), [
    (2, 4, [0, 0, 1, 1]),            # two kv heads, each on two ranks
    (2, 8, [0] * 4 + [1] * 4),
    (1, 2, [0, 0]),                  # multi-query: the one head everywhere
    (4, 2, None),                    # enough heads: a plain split (two per rank)
])
def test_kv_heads_fewer_than_ranks_are_replicated(heads: int, tp: int,
                                                  want: list[int] | None) -> None:
    hd = 8
    got = [shard_interval(heads * hd, j, tp, what="k", unit=hd, replicate=True)
           for j in range(tp)]
    if want is None:
        assert got == [(j * heads * hd // tp, (j + 1) * heads * hd // tp) for j in range(tp)]
    else:
        assert got == [(h * hd, (h + 1) * hd) for h in want]
    cfg = ModelConfig.from_dict({"model_type": "llama", "vocab_size": 64, "hidden_size": 64,
                                 "intermediate_size": 128, "num_hidden_layers": 1,
                                 "num_attention_heads": 8, "num_key_value_heads": heads})
    assert local_config(cfg, tp).num_kv_heads == max(1, heads // tp)


@pytest.mark.parametrize(("heads", "tp"), [(3, 2), (3, 4), (2, 3)])
def test_kv_heads_that_neither_split_nor_replicate_evenly_are_refused(heads: int,
                                                                      tp: int) -> None:
    with pytest.raises(IndivisibleShardError):
        shard_interval(heads * 8, 0, tp, what="k", unit=8, replicate=True)
    cfg = ModelConfig.from_dict({"model_type": "llama", "vocab_size": 60, "hidden_size": 48,
                                 "intermediate_size": 96, "num_hidden_layers": 1,
                                 "num_attention_heads": 12, "num_key_value_heads": heads})
    with pytest.raises(IndivisibleShardError):
        local_config(cfg, tp)


def test_q_heads_are_never_replicated() -> None:
    """Replication is for kv heads only: q heads feed the row-parallel o, whose all-reduce
    would count a replicated head twice."""
    with pytest.raises(IndivisibleShardError):
        shard_interval(2 * 8, 0, 4, what="q", unit=8)
    b = torch.randn(16, 4)
    with pytest.raises(IndivisibleShardError):
        shard_lora_factors(torch.randn(4, 8), b, 1.0, style=COLUMN, layout=LAYOUT_LOCAL,
                           tp_rank=0, tp_size=4, out_unit=8)
    part = shard_lora_factors(torch.randn(4, 8), b, 1.0, style=COLUMN, layout=LAYOUT_LOCAL,
                              tp_rank=3, tp_size=4, out_unit=8, out_replicate=True)
    assert torch.equal(part.b, b[8:16])
