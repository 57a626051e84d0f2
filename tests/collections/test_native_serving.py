"""Collection members served natively by the engine: the cluster's bases resident once in a
basis block, each member's core at its own slot, the three-stage operator in every
projection. References are independent: HF transformers + PEFT on the source adapters (a
lossless fit) or on the members written back as PEFT dirs, and float64 `U Σ Vᵀ x`."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir
from dataplane.collections import JD_DIAG, JD_FULL, TENSORS_FILE, CollectionError, write_bundle
from dataplane.collections.bundle import CollectionBundle, read_bundle
from dataplane.collections.compress import CompressionSpec, compress_collection
from dataplane.collections.member_peft import write_member_peft
from dataplane.core import InvalidRequest, SamplingParams
from dataplane.engine import EngineSpec, build_engine
from dataplane.engine.adapters import AdapterError
from dataplane.engine.engine import Engine
from dataplane.kvcache import PageKind
from dataplane.layers.collection_table import CollectionTable
from tests.engine.helpers import HFReference, hf_logits, plan_for_chunk

PROMPT = [3, 17, 5, 42, 9, 11, 2, 30]
SIZES = dict(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64, block_size=8,
             max_slots=6, max_rank=8, collection_blocks=2, collection_rank=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _bundle(base: Path, members: list[Path], root: Path, spec: CompressionSpec) -> Path:
    abi = read_base_abi(base)
    digests = [validate_peft_dir(m, abi, ArtifactLimits()).h_artifact for m in members]
    bundle = compress_collection(members, abi, spec=spec, sources_h_artifact=digests)
    write_bundle(bundle, root)
    return root


@pytest.fixture(scope="module")
def lossless(collection_base: Path, collection_members: list[Path],
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One basis at R = 13, the sum of the member ranks: every member exact."""
    return _bundle(collection_base, collection_members, tmp_path_factory.mktemp("lossless"),
                   CompressionSpec(method=JD_FULL, rank=13,
                                   max_relative_error=Fraction(1, 10**5)))


@pytest.fixture(scope="module")
def clustered(collection_base: Path, collection_members: list[Path],
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clusters at R = 5 (lossy; no gate): two basis blocks."""
    return _bundle(collection_base, collection_members, tmp_path_factory.mktemp("clustered"),
                   CompressionSpec(method=JD_FULL, rank=5, clusters=2,
                                   max_relative_error=Fraction(1)))


def _engine(base: Path, **overrides: object) -> Engine:
    return build_engine(EngineSpec.of(base, **{**SIZES, **overrides}))  # type: ignore[arg-type]


def _prompt_logits(engine: Engine, slot: int) -> torch.Tensor:
    """The prompt's logits in one prefill chunk, its KV in a block the pool gives for KV
    (any other page may hold an adapter's factors)."""
    kv = engine.block_manager.pool
    [block] = kv.allocate(1, PageKind.KV)
    try:
        return engine.runner.execute(plan_for_chunk(PROMPT, 0, (block,), 8, slot=slot,
                                                    sample_all=True))
    finally:
        kv.free([block], PageKind.KV)


def _untouched(engine: Engine) -> None:
    """No slot bound, every basis block and core zero, no table marked active."""
    assert engine.adapters.free_slots() == list(range(engine.runner.max_slots))
    assert engine.collections.loaded == {}
    for table in engine.runner.collections.values():
        assert not table.active
        assert not table.vt.any() and not table.ut.any() and not table.cores.any()


def test_lossless_members_serve_their_sources_in_one_mixed_batch(
        collection_base: Path, collection_members: list[Path], lossless: Path) -> None:
    engine = _engine(collection_base)
    loaded = engine.load_collection(lossless)
    assert loaded.blocks == {0: 0} and loaded.indices == (0, 1, 2, 3)
    lora = engine.register_adapter(collection_members[1])  # an ordinary LoRA beside them
    assert lora.slot not in {m.slot for m in loaded.members}
    # prompt logits of every member row against HF + PEFT on its source adapter
    plain = hf_logits(collection_base, PROMPT)
    for i, member in enumerate(loaded.members):
        want = hf_logits(collection_base, PROMPT, collection_members[i])
        assert (want - plain).abs().max() > 1e-2
        assert torch.allclose(_prompt_logits(engine, member.slot), want, atol=2e-4, rtol=0)
    assert torch.allclose(_prompt_logits(engine, -1), plain, atol=2e-4, rtol=0)
    # greedy tokens, members + base + the LoRA in one continuously batched run
    ref = HFReference(collection_base, {f"m{i}": p for i, p in enumerate(collection_members)})
    handles = [*loaded.members, None, lora]
    outs = engine.generate([PROMPT] * len(handles), GREEDY, handles)
    names = ["m0", "m1", "m2", "m3", None, "m1"]
    for out, name in zip(outs, names, strict=True):
        assert list(out.token_ids) == ref.greedy(PROMPT, 5, name)[0]


@pytest.mark.parametrize("mode", ["plain", "fold", "collections-only"])
def test_two_clusters_serve_like_their_written_back_members(
        collection_base: Path, clustered: Path, tmp_path: Path, mode: str) -> None:
    bundle = read_bundle(clustered)
    assert sorted(set(bundle.assignment)) == [0, 1]
    engine = (_engine(collection_base, max_rank=0) if mode == "collections-only" else
              _engine(collection_base, lora_fold=mode == "fold"))
    loaded = engine.load_collection(bundle)
    assert sorted(loaded.blocks.values()) == [0, 1]
    written = {f"c{i}": write_member_peft(bundle, i, tmp_path / f"c{i}")
               for i in range(len(bundle.assignment))}
    for i, member in enumerate(loaded.members):
        want = hf_logits(collection_base, PROMPT, written[f"c{i}"])
        assert torch.allclose(_prompt_logits(engine, member.slot), want, atol=2e-4, rtol=0)
    ref = HFReference(collection_base, written)
    outs = engine.generate([PROMPT] * len(loaded.members), GREEDY, list(loaded.members))
    for i, out in enumerate(outs):  # decode steps: folded when `fold`
        assert list(out.token_ids) == ref.greedy(PROMPT, 5, f"c{i}")[0]
    if mode == "collections-only":  # no LoRA slots in the pool: LoRA adapters are refused
        assert engine.pool.max_slots == 0 and not engine.runner.linears
        with pytest.raises(AdapterError, match="rank 5 > 0"):
            engine.register_adapter(written["c0"])


@pytest.mark.parametrize("method", [JD_FULL, JD_DIAG])
def test_table_delta_matches_float64_and_leaves_other_rows_exact(method: str) -> None:
    gen = torch.Generator().manual_seed(5)
    d_in, widths, rank = 12, (10, 6), 3
    table = CollectionTable(4, d_in, widths, blocks=2, rank=5, dtype=torch.float32,
                            device=torch.device("cpu"))
    bases = {b: {k: (torch.randn(w, rank, generator=gen, dtype=torch.float64),
                     torch.randn(d_in, rank, generator=gen, dtype=torch.float64))
                 for k, w in enumerate(widths)} for b in (0, 1)}
    cores = {}
    for slot, block in ((0, 1), (2, 0)):  # slot 1: an ordinary LoRA slot; 3: free
        cores[slot] = {k: (torch.diag(torch.randn(rank, generator=gen, dtype=torch.float64))
                           if method == JD_DIAG else
                           torch.randn(rank, rank, generator=gen, dtype=torch.float64))
                       for k in range(len(widths))}
        table.write_core(slot, block, cores[slot])
    for b, per_slice in bases.items():
        table.write_block(b, per_slice)
    x = torch.randn(6, d_in, generator=gen)
    row_slot = torch.tensor([0, -1, 2, 1, 0, 3], dtype=torch.int32)
    y0 = torch.randn(6, sum(widths), generator=gen)
    y = y0.clone()
    table.add_delta(y, x, row_slot)
    for t, slot in enumerate(row_slot.tolist()):
        if slot not in cores:
            assert torch.equal(y[t], y0[t])  # not a member: exactly untouched
            continue
        block = 1 if slot == 0 else 0
        start = 0
        for k, w in enumerate(widths):
            u, v = bases[block][k]
            want = y0[t, start:start + w].double() + u @ cores[slot][k] @ v.T @ x[t].double()
            assert torch.allclose(y[t, start:start + w].double(), want, atol=1e-4, rtol=1e-5)
            start += w


def test_refused_loads_change_nothing(collection_base: Path, lossless: Path, clustered: Path,
                                      tmp_path: Path) -> None:
    bundle = read_bundle(lossless)
    with pytest.raises(CollectionError, match="serves no collections"):
        _engine(collection_base, collection_blocks=0).load_collection(bundle)
    with pytest.raises(InvalidRequest, match="only collection members"):
        _engine(collection_base, collection_blocks=0, max_rank=0)
    engine = _engine(collection_base)
    other_base = dataclasses.replace(bundle, manifest={**bundle.manifest, "h_base": "0" * 64})
    cases: list[tuple[Engine, CollectionBundle | Path, object, str]] = [
        (engine, other_base, None, "another base"),
        (engine, bundle, [0, 0], "distinct positions"),
        (engine, bundle, [4], "distinct positions"),
        (_engine(collection_base, collection_blocks=1), clustered, None, "basis blocks"),
        (_engine(collection_base, max_slots=3), bundle, None, "adapter slots"),
        (_engine(collection_base, collection_rank=8), bundle, None, "exceeds"),
    ]
    for target, source, members, message in cases:
        with pytest.raises(CollectionError, match=message) as info:
            target.load_collection(source, members)  # type: ignore[arg-type]
        assert info.value.code == "COLLECTION_INVALID"
        _untouched(target)
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for f in lossless.iterdir():
        (tampered / f.name).write_bytes(f.read_bytes())
    data = bytearray((tampered / TENSORS_FILE).read_bytes())
    data[-1] ^= 0xFF
    (tampered / TENSORS_FILE).write_bytes(bytes(data))
    with pytest.raises(CollectionError, match="digests"):
        engine.load_collection(tampered)
    _untouched(engine)


def test_members_come_and_go_sharing_their_cluster_block(
        collection_base: Path, collection_members: list[Path], lossless: Path) -> None:
    engine = _engine(collection_base)
    loaded = engine.load_collection(lossless, [1, 3])
    again = engine.load_collection(lossless, [3, 1])
    assert again.members == loaded.members[::-1]  # loaded members keep their handles
    first = loaded.members[0]
    assert len({m.digest for m in loaded.members}) == 2
    with pytest.raises(CollectionError, match="unload_collection"):
        engine.unregister_adapter(first)
    more = engine.load_collection(lossless, [0, 1])  # adds member 0 to the resident block
    assert more.members[1] == first and more.blocks == loaded.blocks == {0: 0}
    assert len(engine.adapters.free_slots()) == engine.runner.max_slots - 3
    c = engine.model.config  # resident: one block of rank 16 and three members' cores
    shapes = [(c.hidden_size, (c.q_size, c.kv_size, c.kv_size)), (c.q_size, (c.hidden_size,)),
              (c.hidden_size, (c.intermediate_size,) * 2),
              (c.intermediate_size, (c.hidden_size,))]
    assert engine.collections.resident_bytes() == 4 * c.num_layers * sum(
        16 * (d_in + sum(outs)) * len(outs) + 3 * len(outs) * 16 * 16 for d_in, outs in shapes)
    engine.add_request("live", PROMPT, GREEDY, first)
    engine.step()
    with pytest.raises(CollectionError, match="live requests"):
        engine.unload_collection(loaded)
    while engine.has_unfinished():
        engine.step()
    engine.unload_collection(loaded)  # members 1 and 3; member 0 still reads block 0
    assert engine.collections.blocks_in_use() == {loaded.h_collection: {0: 0}}
    with pytest.raises(AdapterError, match="stale or foreign"):
        engine.add_request("stale", PROMPT, GREEDY, first)
    with pytest.raises(CollectionError, match="not loaded"):
        engine.unload_collection(more)  # member 1 of it is gone
    alone = engine.load_collection(lossless, [0])
    assert alone.members == (more.members[0],)
    out = engine.generate([PROMPT], GREEDY, list(alone.members))[0]  # siblings gone
    ref = HFReference(collection_base, {"m0": collection_members[0]})
    assert list(out.token_ids) == ref.greedy(PROMPT, 5, "m0")[0]
    engine.unload_collection(alone)
    _untouched(engine)
    back = engine.load_collection(lossless, [1, 3])
    assert [m.digest for m in back.members] == [m.digest for m in loaded.members]
    assert back.members[0].slot_generation > first.slot_generation


def test_member_served_as_its_artifact_records_kernel_local(
        collection_base: Path, lossless: Path, tmp_path: Path) -> None:
    from dataplane.engine.adapters import load_peft_adapter
    from tests.engine.test_adapters import _expected_kernel_local

    bundle = read_bundle(lossless)
    member_dir = write_member_peft(bundle, 2, tmp_path / "m2")
    artifact = load_peft_adapter(member_dir, read_base_abi(collection_base), 16)
    engine = _engine(collection_base)
    own = engine.load_collection(bundle, [0])
    assert own.members[0].slot not in engine.adapters.kernel_local  # no artifact: no record
    served = engine.load_collection(bundle, [2], {2: artifact})
    member = served.members[0]
    assert member.digest == artifact.digest  # the artifact's semantic identity
    assert engine.adapters.kernel_local[member.slot] == (_expected_kernel_local(
        member_dir, collection_base, "collection-torch", f"collection:{bundle.h_collection}"),)
    with pytest.raises(CollectionError, match="another identity"):
        engine.load_collection(bundle, [2])  # the same member under its default identity
    engine.unload_collection(served)
    assert member.slot not in engine.adapters.kernel_local
