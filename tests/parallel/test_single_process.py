"""Shard slicing, adapter shards and H_kernel_local records (no process group)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.identity import (
    REPLICATED,
    SPLIT_INPUT,
    SPLIT_OUTPUT,
    IdentityError,
    KernelLocalIdentity,
    ModuleSpec,
    ShardRange,
    tp_local_layout,
)
from dataplane.models import ModelConfig
from dataplane.parallel import (
    COLUMN,
    ROW,
    IndivisibleShardError,
    ProcessGroupError,
    ShardShapeError,
    UnknownLayoutError,
    init_tp_group_from_env,
    shard_lora_factors,
)
from dataplane.parallel.collectives import TPGroup
from dataplane.parallel.layout_identity import (
    TP_SCHEDULE_REVISION,
    lora_local_layout,
    style_of,
    tp_contract_digest,
    tp_kernel_local_identity,
)
from dataplane.parallel.shard import shard_interval
from dataplane.parallel.shard_model import (
    STYLE_OF,
    local_config,
    rank_kernel_local,
    shard_adapter,
)
from dataplane.parallel.vocab import vocab_part

HEX = "0" * 63 + "1"


def spec(name: str, d_out: int, d_in: int, rank: int) -> ModuleSpec:
    return ModuleSpec(name=name, role=name.rsplit(".", 1)[-1], base_shape=(d_out, d_in),
                      rank=rank, alpha=Fraction(rank * 2), scaling_rule="alpha/r",
                      dtype="float16", a_sha256=HEX, b_sha256=HEX)


@pytest.mark.parametrize("style", [COLUMN, ROW])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_shards_recompose_the_global_update(style: str, n: int) -> None:
    """float64: concatenated (column) / summed (row) per-rank deltas equal s X A^T B^T."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    a = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    b = torch.randn(12, 4, generator=gen, dtype=torch.float64)
    want = 0.5 * (x @ a.T) @ b.T
    parts = [shard_lora_factors(a, b, 0.5, style=style, tp_rank=j, tp_size=n)
             for j in range(n)]
    assert all(f.scale == 0.5 for f in parts)
    if style == COLUMN:  # A whole on every rank, B's output rows in rank order
        assert all(torch.equal(f.a, a) for f in parts)
        assert torch.equal(torch.cat([f.b for f in parts], 0), b)
        got = torch.cat([f.scale * (x @ f.a.T) @ f.b.T for f in parts], 1)
    else:  # A's input columns, B whole: sum_j (x_j A_j^T) B^T
        assert all(torch.equal(f.b, b) for f in parts)
        assert torch.equal(torch.cat([f.a for f in parts], 1), a)
        xs = torch.chunk(x, n, dim=1)
        got = sum((f.scale * (xj @ f.a.T) @ f.b.T for xj, f in zip(xs, parts, strict=True)),
                  torch.zeros(5, 12, dtype=torch.float64))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_shard_errors_are_typed_and_checked_first() -> None:
    a, b = torch.zeros(3, 8), torch.zeros(8, 3)
    for style in (COLUMN, ROW):  # 8 outputs / 8 inputs over 3 ranks
        with pytest.raises(IndivisibleShardError) as err:
            shard_lora_factors(a, b, 1.0, style=style, tp_rank=0, tp_size=3)
        assert err.value.code == "indivisible_shard"
    with pytest.raises(ShardShapeError):  # rank 3 vs 4, before any slicing
        shard_lora_factors(a, torch.zeros(8, 4), 1.0, style=ROW, tp_rank=0, tp_size=2)
    with pytest.raises(ShardShapeError):
        shard_lora_factors(torch.zeros(8), b, 1.0, style=COLUMN, tp_rank=0, tp_size=2)
    with pytest.raises(UnknownLayoutError):
        shard_lora_factors(a, b, 1.0, style="paper", tp_rank=0, tp_size=2)
    with pytest.raises(IndivisibleShardError):  # kv heads split on head boundaries only
        shard_lora_factors(torch.zeros(2, 8), torch.zeros(4, 2), 1.0, style=COLUMN,
                           tp_rank=0, tp_size=2, out_unit=4)
    with pytest.raises(IndivisibleShardError):
        shard_lora_factors(a, b, 1.0, style=COLUMN, tp_rank=2, tp_size=2)


def test_local_factors_are_independent_copies() -> None:
    for style in (COLUMN, ROW):
        a, b = torch.arange(16.0).view(2, 8), torch.arange(16.0).view(8, 2)
        f = shard_lora_factors(a, b, 1.0, style=style, tp_rank=1, tp_size=2)
        assert f.a.is_contiguous() and f.b.is_contiguous()
        held = (f.a.clone(), f.b.clone())
        a.fill_(-1.0)
        b.fill_(-1.0)  # the caller reuses its buffers: the shard keeps its values
        assert torch.equal(f.a, held[0]) and torch.equal(f.b, held[1])
        assert not torch.equal(f.a, a[:, 4:] if style == ROW else a)


def test_layout_records_name_their_style_and_count_scalars() -> None:
    q = spec("model.layers.0.self_attn.q_proj", 64, 32, 8)
    o = spec("model.layers.0.self_attn.o_proj", 32, 64, 8)
    for s, style in ((q, COLUMN), (o, ROW)):
        for rank in (0, 1):
            rec = lora_local_layout(s, style=style, tp_rank=rank, tp_size=2)
            assert style_of(rec) == style
    # exactly identity.tp_local_layout's SPLIT_OUTPUT / SPLIT_INPUT
    assert lora_local_layout(q, style=COLUMN, tp_rank=1, tp_size=2) \
        == tp_local_layout(q, tp_rank=1, tp_size=2, split=SPLIT_OUTPUT)
    assert lora_local_layout(o, style=ROW, tp_rank=1, tp_size=2) \
        == tp_local_layout(o, tp_rank=1, tp_size=2, split=SPLIT_INPUT)
    col = lora_local_layout(q, style=COLUMN, tp_rank=1, tp_size=2)
    assert (col.a_shard, col.b_shard) == (None, ShardRange("output", 32, 64))
    assert col.local_scalars(q) == 8 * 32 + 32 * 8  # A whole [r, d_in], B [d_out/2, r]
    row = lora_local_layout(o, style=ROW, tp_rank=1, tp_size=2)
    assert (row.a_shard, row.b_shard) == (ShardRange("input", 32, 64), None)
    assert row.local_scalars(o) == 8 * 32 + 32 * 8  # A [r, d_in/2], B whole [d_out, r]
    # a kv head shared by two of four ranks: the record names the whole head
    k = spec("model.layers.0.self_attn.k_proj", 16, 32, 8)
    kv = [lora_local_layout(k, style=COLUMN, tp_rank=j, tp_size=4, out_unit=8,
                            out_replicate=True).b_shard for j in range(4)]
    assert kv == [ShardRange("output", 0, 8)] * 2 + [ShardRange("output", 8, 16)] * 2
    with pytest.raises(UnknownLayoutError):  # both factors whole: no TP schedule
        style_of(tp_local_layout(q, tp_rank=0, tp_size=2, split=REPLICATED))
    with pytest.raises(UnknownLayoutError):
        lora_local_layout(q, style="paper", tp_rank=0, tp_size=2)


def test_h_kernel_local_changes_with_the_style_and_rank() -> None:
    q = spec("model.layers.0.self_attn.q_proj", 64, 32, 8)
    o = spec("model.layers.0.self_attn.o_proj", 32, 64, 8)

    def ident(q_style: str, rank: int) -> KernelLocalIdentity:
        return tp_kernel_local_identity(
            adapter_semantic=HEX, kernel_family="torch", conversion_revision=1,
            dtype="float16", packing="stacked", specs=[q, o],
            styles={q.name: q_style, o.name: ROW}, tp_rank=rank, tp_size=2)

    digests = {ident(style, r).h_kernel_local for style in (COLUMN, ROW) for r in (0, 1)}
    assert len(digests) == 4
    got = ident(COLUMN, 1)
    assert got.kernel_family == f"torch+{TP_SCHEDULE_REVISION}"
    assert [style_of(layout) for layout in got.layouts] == [ROW, COLUMN]  # sorted by name
    assert ident(COLUMN, 1).h_kernel_local == got.h_kernel_local  # deterministic
    with pytest.raises(UnknownLayoutError):
        tp_kernel_local_identity(adapter_semantic=HEX, kernel_family="torch",
                                 conversion_revision=1, dtype="float16", packing="stacked",
                                 specs=[q, o], styles={q.name: COLUMN},
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


def test_contract_digest_binds_adapter_tp_size_slot_and_pages() -> None:
    d = tp_contract_digest(HEX, 2, 3, (4, 5))
    assert d == tp_contract_digest(HEX, 2, 3, (4, 5))
    other = "0" * 63 + "2"
    assert len({d, tp_contract_digest(other, 2, 3, (4, 5)), tp_contract_digest(HEX, 4, 3, (4, 5)),
                tp_contract_digest(HEX, 2, 0, (4, 5)), tp_contract_digest(HEX, 2, 3, (5, 4)),
                tp_contract_digest(HEX, 2, 3, (4,)), tp_contract_digest(None, 2, 3, (4, 5))}) == 7
    with pytest.raises(IdentityError):
        tp_contract_digest("not-a-digest", 2, 3, (4, 5))


def test_process_group_from_env_is_validated() -> None:
    with pytest.raises(ProcessGroupError) as err:
        init_tp_group_from_env({"RANK": "0"})
    assert err.value.code == "process_group_invalid"
    with pytest.raises(ProcessGroupError):
        init_tp_group_from_env({"RANK": "2", "WORLD_SIZE": "2"}, device="cpu")
    group = init_tp_group_from_env({"RANK": "0", "WORLD_SIZE": "1"}, device="cpu")
    assert (group.rank, group.size, group.group) == (0, 1, None)


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
        shard_lora_factors(torch.randn(4, 8), b, 1.0, style=COLUMN, tp_rank=0, tp_size=4,
                           out_unit=8)
    part = shard_lora_factors(torch.randn(4, 8), b, 1.0, style=COLUMN, tp_rank=3, tp_size=4,
                              out_unit=8, out_replicate=True)
    assert torch.equal(part.b, b[8:16])


# hidden 32, 4 heads and 2 kv heads of 8, MLP 64: at TP=4 each kv head is on two ranks
ADAPTER_CONFIG = ModelConfig.from_dict({
    "model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})
MODULE_PATHS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp",
                "down_proj": "mlp"}


def global_adapter() -> LoadedAdapter:
    """Rank 4 on every projection of layer 0, rank 2 on q/v/o of layer 1 (float64)."""
    gen = torch.Generator().manual_seed(7)
    mods = []
    for layer, rank, names in ((0, 4, tuple(MODULE_PATHS)), (1, 2, ("q_proj", "v_proj",
                                                                    "o_proj"))):
        for name in names:
            d_out, d_in = ADAPTER_CONFIG.module_shapes[name]
            mods.append(ModuleFactors(layer, name,
                                      torch.randn(rank, d_in, generator=gen, dtype=torch.float64),
                                      torch.randn(d_out, rank, generator=gen,
                                                  dtype=torch.float64), 0.5 * (layer + 1)))
    return LoadedAdapter(tuple(mods), "a" * 64, "adapter-a")


def module_spec(m: ModuleFactors) -> ModuleSpec:
    name = f"model.layers.{m.layer}.{MODULE_PATHS[m.module]}.{m.module}"
    return ModuleSpec(name=name, role=m.module, base_shape=(m.b.shape[0], m.a.shape[1]),
                      rank=m.rank, alpha=Fraction(m.rank), scaling_rule="alpha/r",
                      dtype="float32", a_sha256=HEX, b_sha256=HEX)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_shard_adapter_recomposes_the_global_delta(n: int) -> None:
    """Column (q/k/v, gate/up): A whole, the ranks' B shards in head units concatenate to
    B (a kv head shared by several ranks is the same rows on each); row (o, down): B
    whole and ``sum_j x_j A_j^T B^T = x A^T B^T``. Local shapes are the local model's,
    and each rank's H_kernel_local record counts exactly the scalars it holds."""
    gc, adapter = ADAPTER_CONFIG, global_adapter()
    hd, kv_heads = gc.head_dim, gc.num_kv_heads
    lc = local_config(gc, n)
    shards = [shard_adapter(adapter, gc, j, n) for j in range(n)]
    specs = tuple(module_spec(m) for m in adapter.modules)
    x = torch.randn(3, max(gc.hidden_size, gc.intermediate_size),
                    generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    for shard in shards:
        assert (shard.digest, shard.source) == (adapter.digest, adapter.source)
        assert len(shard.modules) == len(adapter.modules)
    for i, m in enumerate(adapter.modules):
        local = [s.modules[i] for s in shards]
        assert all((f.layer, f.module, f.scale) == (m.layer, m.module, m.scale) for f in local)
        d_out, d_in = lc.module_shapes[m.module]
        assert all(f.a.shape == (m.rank, d_in) and f.b.shape == (d_out, m.rank) for f in local)
        if STYLE_OF[m.module] == COLUMN:
            assert all(torch.equal(f.a, m.a) for f in local)
            if m.module in ("k_proj", "v_proj") and n > kv_heads:
                share = n // kv_heads  # ranks per kv head
                for j, f in enumerate(local):
                    head = j // share
                    assert torch.equal(f.b, m.b[head * hd:(head + 1) * hd])
                b = torch.cat([local[h * share].b for h in range(kv_heads)], 0)
            else:
                b = torch.cat([f.b for f in local], 0)
            assert torch.equal(b, m.b)
            delta = torch.cat([f.scale * (x[:, :d_in] @ f.a.T) @ f.b.T for f in local], 1)
            if m.module in ("k_proj", "v_proj") and n > kv_heads:
                delta = delta[:, [c for j in range(0, n, n // kv_heads)
                                  for c in range(j * hd, (j + 1) * hd)]]
        else:
            assert all(torch.equal(f.b, m.b) for f in local)
            xs = torch.chunk(x[:, :m.a.shape[1]], n, dim=1)
            delta = sum((f.scale * (xj @ f.a.T) @ f.b.T for xj, f in zip(xs, local,
                                                                         strict=True)),
                        torch.zeros(3, m.b.shape[0], dtype=torch.float64))
        want = m.scale * (x[:, :m.a.shape[1]] @ m.a.T) @ m.b.T
        torch.testing.assert_close(delta, want, rtol=1e-12, atol=1e-12)
    for j, shard in enumerate(shards):
        ident = rank_kernel_local(specs, HEX, gc, "torch", "float32", j, n)
        by_name = {layout.name: layout for layout in ident.layouts}
        assert (ident.tp_rank, ident.tp_size) == (j, n)
        for m, f, s in zip(adapter.modules, shard.modules, specs, strict=True):
            layout = by_name[s.name]
            assert style_of(layout) == STYLE_OF[m.module]
            assert layout.local_scalars(s) == f.a.numel() + f.b.numel()


def test_shard_adapter_refuses_a_module_without_a_parallel_style() -> None:
    a, b = torch.zeros(4, 32), torch.zeros(96, 4)
    adapter = LoadedAdapter((ModuleFactors(0, "lm_head", a, b, 1.0),), "a" * 64)
    with pytest.raises(ShardShapeError):
        shard_adapter(adapter, ADAPTER_CONFIG, 0, 2)
