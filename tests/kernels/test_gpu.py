"""GPU tests: the big matrix on CUDA and CUDA-graph capture of a whole step.

Marked ``gpu``; skipped without CUDA. Run on the device with
``python3 -m pytest tests/kernels -m gpu``.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace, get_lora_backend
from dataplane.kernels.reference import lora_delta_reference_grouped
from dataplane.kernels.triton.fused_kernel import EPOCH_SIZE

from .lora_cases import DISTRIBUTIONS, TOLERANCE, make_case

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = [  # (in, out slices, rows)
    (4096, (4096,), 1),
    (4096, (4096,), 64),
    (4000, (4100,), 256),  # not multiples of any tile
    (4096, (4096, 1024, 1024), 256),  # GQA q/k/v
    (2048, (5632, 5632), 1024),  # gate/up
    (4096, (4096,), 4096),  # prefill
]
RANK_SETS = ([16], [64], [8, 16, 32, 64], [1, 128, 7, 33])
CASES = list(itertools.product(DTYPES, range(len(SHAPES))))
IDS = [f"{str(d).removeprefix('torch.')}-shape{i}" for d, i in CASES]


@pytest.mark.parametrize(("dtype", "shape_i"), CASES, ids=IDS)
def test_big_matrix_on_cuda(cuda_device: torch.device, dtype: torch.dtype, shape_i: int) -> None:
    d_in, outs, rows = SHAPES[shape_i]
    i = CASES.index((dtype, shape_i))
    dist = DISTRIBUTIONS[i % len(DISTRIBUTIONS)]
    case = make_case(
        dtype=dtype,
        in_features=d_in,
        out_features=outs,
        ranks=RANK_SETS[i % len(RANK_SETS)],
        num_rows=rows,
        dist=dist,
        none_share=(0.0, 0.25)[i % 2],
        seed=i,
        device=cuda_device,
        layout=("scattered", "stacked")[i % 2],
        absent_every=3 if len(outs) > 1 else 0,
    )
    y = case.run(get_lora_backend(cuda_device)).double()
    ref = case.y0.double() + lora_delta_reference_grouped(
        case.x, case.row_slot, case.factors, outs, cuda_device
    )
    err = float((y - ref).norm() / ref.norm())
    assert torch.isfinite(y).all()
    assert err < TOLERANCE[dtype], err
    untouched = torch.tensor([s < 0 for s in case.row_slot], device=cuda_device)
    assert torch.equal(y[untouched], case.y0.double()[untouched])


def test_step_is_cuda_graph_capturable(cuda_device: torch.device) -> None:
    """Capture metadata build + two modules; replay with new row slots."""
    backend = get_lora_backend(cuda_device)
    t, s = 64, 8
    cases = [
        make_case(dtype=torch.bfloat16, in_features=1024, out_features=outs, ranks=[8, 64, 16],
                  num_rows=t, dist="uniform", none_share=0.2, seed=k, device=cuda_device)
        for k, outs in enumerate([(1024, 256, 256), (1024,)])
    ]  # fmt: skip
    buffers = LoraMetaBuffers(t, cases[0].table.num_slots, cuda_device)
    ws = LoraWorkspace(backend.workspace_numel(t, 3, 64), cuda_device)
    static_slots = torch.zeros(t, dtype=torch.int32, device=cuda_device)
    ys = [c.y0.clone() for c in cases]

    def step() -> None:
        meta = backend.build_meta(static_slots, buffers)
        for c, y in zip(cases, ys, strict=True):
            backend.add_lora(y, c.x, meta, c.table.weights, ws)

    static_slots.copy_(torch.tensor(cases[0].row_slot, dtype=torch.int32))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        new_slots = torch.randint(-1, s, (t,), generator=gen).tolist()
        static_slots.copy_(torch.tensor(new_slots, dtype=torch.int32))
        for c, y in zip(cases, ys, strict=True):
            y.copy_(c.y0)
        graph.replay()
        torch.cuda.synchronize()
        for c, y in zip(cases, ys, strict=True):
            ref = c.y0.double() + lora_delta_reference_grouped(
                c.x, new_slots, c.factors, c.out_features, cuda_device
            )
            err = float((y.double() - ref).norm() / ref.norm())
            assert err < TOLERANCE[torch.bfloat16], err


@pytest.mark.parametrize("weighted", [0, 1], ids=["even", "weighted"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fused_decode_is_deterministic_and_resets_counters(
    cuda_device: torch.device, dtype: torch.dtype, weighted: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused launch joins split-K partials across programs through counters.

    One workspace serves steps whose live tiles (hence splits per tile) change:
    every result must match the float64 reference and the two-kernel path,
    repeat bit for bit (a race would move it), and leave every counter at a whole
    number of epochs (each group's split shares sum to exactly one per launch).
    ``weighted``: every table entry with per-slice item counts by factor bytes (q/k/v:
    more splits for q than for k and v).
    """
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend
    from dataplane.kernels.triton.configs import fused_config
    from dataplane.kernels.triton.fused_ops import fused_fits

    monkeypatch.setattr(configs, "FUSED_TABLE", {
        k: dataclasses.replace(c, weighted=weighted) for k, c in configs.FUSED_TABLE.items()})

    fused, two = TritonLoraBackend(fused=True), TritonLoraBackend(fused=False)
    ws = LoraWorkspace(fused.workspace_numel(256, 3, 128), cuda_device)
    for k, (rows, dist, ranks, outs) in enumerate([
        (1, "identical", [64], (4096,)),  # one tile: the most splits
        (64, "distinct", [16], (4096,)),
        (64, "identical", [128, 8], (4096, 1024, 1024)),
        (256, "uniform", [8, 16, 32, 64], (4096,)),
        (7, "zipf1.5", [1, 33], (4000, 1000)),  # widths off the tile
        # q/k/v with 64 live slots: >= 2 K splits only above the per-SM bound
        (64, "distinct", [16], (4096, 1024, 1024)),  # the engine's decode case
        (256, "distinct", [64], (4096, 1024, 1024)),
        (64, "distinct", [16], (14336, 14336)),  # gate/up, Llama-8B widths
    ]):  # fmt: skip
        case = make_case(dtype=dtype, in_features=4096 if k != 4 else 4000, out_features=outs,
                         ranks=ranks, num_rows=rows, dist=dist, none_share=0.2 * (k % 2),
                         seed=100 + k, device=cuda_device)  # fmt: skip
        buffers = LoraMetaBuffers(rows, case.table.num_slots, cuda_device)
        slots = torch.tensor(case.row_slot, dtype=torch.int32, device=cuda_device)
        meta = fused.build_meta(slots, buffers)
        w = case.table.weights
        cfg = fused_config(rows, w.max_rank, w.in_features, tuple(w.out_features))
        assert cfg is not None and fused_fits(  # every case here takes the fused launch
            rows, w.num_slots, w.in_features, tuple(w.out_features), w.max_rank, cfg,
            ws.buffer.numel(), ws.COUNTERS, cuda_device,
        )  # fmt: skip
        outs_seen = []
        for backend in (fused, fused, fused, two):
            y = case.y0.clone()
            before = ws.counters.clone()
            backend.add_lora(y, case.x, meta, case.table.weights, ws)
            torch.cuda.synchronize()
            assert int((ws.counters % EPOCH_SIZE).abs().sum()) == 0
            if backend is fused and k == 0:  # one tile, the most splits: they did join
                assert int((ws.counters - before).sum()) == EPOCH_SIZE
            outs_seen.append(y)
        assert torch.equal(outs_seen[0], outs_seen[1]) and torch.equal(outs_seen[0], outs_seen[2])
        ref = case.y0.double() + lora_delta_reference_grouped(
            case.x, case.row_slot, case.factors, outs, cuda_device
        )
        for y in (outs_seen[0], outs_seen[3]):
            err = float((y.double() - ref).norm() / ref.norm())
            assert err < TOLERANCE[dtype], (k, err)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernel"])
@pytest.mark.parametrize("outs", [(4096,), (4096, 1024, 1024), (14336, 14336)])
def test_pdl_launches_wait_for_the_gemm_that_writes_y(
    cuda_device: torch.device, outs: tuple[int, ...], fused: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``pdl`` the LoRA launches (the fused one, or shrink and expand) may start while
    the base GEMM before them still writes ``y``: ``y`` must be read only after the wait.
    Each replay recomputes ``y = x Wᵀ`` (a GEMM big enough to still be running when the
    launch starts) and adds the LoRA delta, eagerly and in a CUDA graph, against the
    float64 reference."""
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend
    from dataplane.kernels.triton.ops import pdl_launch

    for name in ("FUSED_TABLE", "SHRINK_TABLE", "EXPAND_TABLE"):
        monkeypatch.setattr(configs, name, {
            k: dataclasses.replace(c, pdl=1) for k, c in getattr(configs, name).items()})
    if not pdl_launch(1, cuda_device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    backend = TritonLoraBackend(fused=fused)
    case = make_case(dtype=torch.bfloat16, in_features=4096, out_features=outs, ranks=[16],
                     num_rows=128, dist="distinct", none_share=0.1, seed=11,
                     device=cuda_device)  # fmt: skip
    weight = torch.randn(sum(outs), 4096, device=cuda_device, dtype=torch.bfloat16) * 0.02
    base = (case.x.double() @ weight.double().t())
    ref = base + lora_delta_reference_grouped(case.x, case.row_slot, case.factors, outs,
                                              cuda_device)
    meta = backend.build_meta(torch.tensor(case.row_slot, dtype=torch.int32,
                                           device=cuda_device),
                              LoraMetaBuffers(128, case.table.num_slots, cuda_device))
    ws = LoraWorkspace(backend.workspace_numel(128, len(outs), 16), cuda_device)
    y = torch.empty(128, sum(outs), device=cuda_device, dtype=torch.bfloat16)

    def layer() -> None:
        torch.mm(case.x, weight.t(), out=y)
        backend.add_lora(y, case.x, meta, case.table.weights, ws)

    def check() -> None:
        torch.cuda.synchronize()
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < TOLERANCE[torch.bfloat16], err
        assert int((ws.counters % EPOCH_SIZE).abs().sum()) == 0

    for _ in range(3):
        y.fill_(float("nan"))  # a read of y before the GEMM wrote it shows up
        layer()
        check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        check()


@pytest.mark.parametrize(("num_rows", "num_slots"), [(1000, 32), (4096, 32), (16500, 256)])
def test_large_step_metadata_matches_stable_sort(
    cuda_device: torch.device, num_rows: int, num_slots: int
) -> None:
    """Every metadata method (incl. the blocked ones at several block sizes)
    against torch's stable sort, at prefill sizes.

    Above 4096 rows only what auto can pick there: the default path (blocked
    grouping, ``BLOCKED_METHOD`` at ``BLOCKED_ROWS``) and the other blocked
    method at the same block (the bench's alternative for ``BLOCKED_METHOD``).
    One-program ``chunked`` and ``sort`` are not candidates at that size (and
    ``chunked`` at 16,500 rows x 512 slot columns made this case the slowest
    of the file); smaller sizes still run every method.
    """
    from dataplane.kernels.triton.meta_kernel import BLOCKED_METHOD, BLOCKED_ROWS, build_meta_triton

    gen = torch.Generator().manual_seed(num_rows)
    per = max(1, num_rows // num_slots)  # prefill-like runs, then shuffled tail with -1 rows
    slots = [min(t // per, num_slots - 1) for t in range(num_rows)]
    tail = torch.randint(-1, num_slots, (num_rows // 3,), generator=gen).tolist()
    row_slot = torch.tensor(slots[: num_rows - len(tail)] + tail, dtype=torch.int32)
    key = torch.where(row_slot < 0, num_slots, row_slot.long())
    counts = torch.bincount(key, minlength=num_slots + 1)[:num_slots]
    want = (torch.sort(key, stable=True).indices.tolist(), counts.tolist(),
            (torch.cumsum(counts, 0) - counts).tolist())  # fmt: skip
    variants = [(None, None), ("blocked", 256), ("blocked", 1024), ("blocked1", 256),
                ("blocked1", 512), ("sort", None), ("chunked", None)]  # fmt: skip
    if num_rows > 4096:
        other = "blocked1" if BLOCKED_METHOD == "blocked" else "blocked"
        variants = [(None, None), (other, BLOCKED_ROWS)]
    for method, block in variants:
        buffers = LoraMetaBuffers(num_rows, num_slots, cuda_device)
        meta = build_meta_triton(row_slot.to(cuda_device), buffers, method, block)
        got = (meta.sorted_rows.tolist(), meta.slot_counts.tolist(), meta.slot_starts.tolist())
        assert got == want, (method, block)


@pytest.mark.parametrize("y_prefetch", [False, True])
@pytest.mark.parametrize("rank_set", [[16], [64], [1, 128, 7, 33]], ids=str)
def test_prefill_expand_variants_on_cuda(
    cuda_device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
    y_prefetch: bool,
    rank_set: list[int],
) -> None:
    """Both prefill column loops (``y`` or ``Bt`` prefetch), every rank bucket."""
    from dataplane.kernels.triton import configs
    from dataplane.kernels.triton.backend import TritonLoraBackend

    for r_key in configs.R_BUCKETS:
        cur = configs.EXPAND_TABLE[(4096, r_key)]
        monkeypatch.setitem(
            configs.EXPAND_TABLE, (4096, r_key), dataclasses.replace(cur, y_prefetch=y_prefetch)
        )
    case = make_case(dtype=torch.bfloat16, in_features=4096, out_features=(4096, 1000),
                     ranks=rank_set, num_rows=4096, dist="zipf1.5", none_share=0.1,
                     seed=len(rank_set) + y_prefetch, device=cuda_device)  # fmt: skip
    y = case.run(TritonLoraBackend(fused=False)).double()
    ref = case.y0.double() + lora_delta_reference_grouped(
        case.x, case.row_slot, case.factors, case.out_features, cuda_device
    )
    err = float((y - ref).norm() / ref.norm())
    assert err < TOLERANCE[torch.bfloat16], err
    untouched = torch.tensor([s < 0 for s in case.row_slot], device=cuda_device)
    assert torch.equal(y[untouched], case.y0.double()[untouched])


def test_blocked_metadata_is_cuda_graph_capturable(cuda_device: torch.device) -> None:
    """The default large-step build (two launches, scratch in the buffers)
    captured once, replayed with new slots: same as torch's stable sort."""
    from dataplane.kernels.triton.backend import TritonLoraBackend

    t, s = 3000, 40
    backend = TritonLoraBackend()
    buffers = LoraMetaBuffers(t, s, cuda_device)
    static_slots = torch.zeros(t, dtype=torch.int32, device=cuda_device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.build_meta(static_slots, buffers)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta = backend.build_meta(static_slots, buffers)
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        new = torch.randint(-1, s, (t,), generator=gen, dtype=torch.int32)
        static_slots.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        key = torch.where(new < 0, s, new.long())
        counts = torch.bincount(key, minlength=s + 1)[:s]
        assert meta.sorted_rows.tolist() == torch.sort(key, stable=True).indices.tolist()
        assert meta.slot_counts.tolist() == counts.tolist()
        assert meta.slot_starts.tolist() == (torch.cumsum(counts, 0) - counts).tolist()
