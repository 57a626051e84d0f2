"""The gate/up expand folded into SiLU·mul (``add_lora_silu_mul``) against float64.

Reference: ``silu(g + Δg) * (u + Δu)`` with the deltas from the independent float64
LoRA reference (``lora_delta_reference``) and ``gate_up`` as given. Rows without an
adapter and slices an adapter does not target get the plain activation of the base
output; ``gate_up`` itself is never modified. Runs the Triton kernel through the
interpreter on CPU (CUDA when present), with the two-kernel path (decode-sized steps
take the fused launch and the backend returns None for them, also checked).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.reference import lora_delta_reference

from .lora_cases import TOLERANCE, LoraCase, enable_folded_silu, make_case

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _folded(monkeypatch: pytest.MonkeyPatch) -> None:
    enable_folded_silu(monkeypatch)


def _run(case: LoraCase, fused: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    from dataplane.kernels.triton.backend import TritonLoraBackend

    backend = TritonLoraBackend(fused=fused)
    device = case.x.device
    buffers = LoraMetaBuffers(len(case.row_slot), case.table.num_slots, device)
    meta = backend.build_meta(torch.tensor(case.row_slot, dtype=torch.int32, device=device),
                              buffers)  # fmt: skip
    w = case.table.weights
    ws = LoraWorkspace(backend.workspace_numel(len(case.row_slot), 2, w.max_rank), device)
    gate_up = case.y0.clone()
    act = backend.add_lora_silu_mul(gate_up, case.x, meta, w, ws)
    return act, gate_up


def _reference(case: LoraCase) -> torch.Tensor:
    inter = case.out_features[0]
    y = case.y0.double().cpu() + lora_delta_reference(
        case.x, case.row_slot, case.factors, case.out_features
    )
    return F.silu(y[:, :inter]) * y[:, inter:]


@pytest.mark.parametrize(
    ("dtype", "rows", "inter", "ranks", "dist", "none_share", "absent_every"),
    [
        (torch.float32, 21, 40, [5, 33, 16], "uniform", 0.3, 3),
        (torch.bfloat16, 40, 72, [8, 16], "zipf1.5", 0.2, 2),
        (torch.float16, 17, 24, [1, 64], "skewed", 0.0, 0),
        (torch.float32, 9, 136, [16], "identical", 0.5, 0),
        (torch.bfloat16, 12, 40, [7], "uniform", 1.0, 0),  # no adapter rows at all
    ],
    ids=["fp32-mixed-absent", "bf16-zipf", "fp16-skewed", "fp32-identical", "bf16-all-base"],
)
def test_expand_silu_matches_reference(
    dtype: torch.dtype,
    rows: int,
    inter: int,
    ranks: list[int],
    dist: str,
    none_share: float,
    absent_every: int,
) -> None:
    case = make_case(
        dtype=dtype, in_features=48, out_features=(inter, inter), ranks=ranks,
        num_rows=rows, dist=dist, none_share=none_share, seed=rows + inter,
        device=TRITON_DEVICE, absent_every=absent_every,
    )  # fmt: skip
    y0 = case.y0.clone()
    act, gate_up = _run(case, fused=False)
    assert act is not None and act.shape == (rows, inter) and act.dtype == dtype
    assert torch.equal(gate_up, y0), "gate_up must not be modified"
    ref = _reference(case)
    got = act.double().cpu()
    assert torch.isfinite(got).all()
    err = (got - ref).norm() / ref.norm()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"
    # Rows without an adapter (and slices not targeted) see no delta at all: their
    # activation is the plain one of the base output, to the dtype's one rounding.
    base = F.silu(y0.double().cpu()[:, :inter]) * y0.double().cpu()[:, inter:]
    plain = [t for t, s in enumerate(case.row_slot) if s < 0 or not case.factors[s]]
    if plain:
        tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
        diff = (got[plain] - base[plain]).abs() / (base[plain].abs() + 1.0)
        assert float(diff.max()) < tol
    if none_share < 1.0:  # the adapters do change the output (the test can fail)
        adapted = [t for t, s in enumerate(case.row_slot) if s >= 0]
        assert float((got[adapted] - base[adapted]).abs().max()) > 10 * TOLERANCE[dtype]


def test_decode_sized_steps_take_the_fused_launch() -> None:
    """With the fused launch on, a decode-sized step returns None (the caller adds the
    delta through ``add_lora`` and applies the activation)."""
    case = make_case(
        dtype=torch.float32, in_features=32, out_features=(24, 24), ranks=[8], num_rows=6,
        dist="uniform", none_share=0.0, seed=3, device=TRITON_DEVICE,
    )  # fmt: skip
    act, gate_up = _run(case, fused=True)
    assert act is None and torch.equal(gate_up, case.y0)


def test_classes_without_an_entry_do_not_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataplane.kernels.triton import configs

    case = make_case(
        dtype=torch.float32, in_features=32, out_features=(24, 24), ranks=[8], num_rows=6,
        dist="uniform", none_share=0.0, seed=3, device=TRITON_DEVICE,
    )  # fmt: skip
    monkeypatch.setitem(configs.SILU_TABLE, configs.bucket(6, configs.T_BUCKETS), None)
    act, gate_up = _run(case, fused=False)
    assert act is None and torch.equal(gate_up, case.y0)


def test_torch_backend_has_no_folded_path() -> None:
    from dataplane.kernels.torch_backend import TorchLoraBackend

    case = make_case(
        dtype=torch.float32, in_features=16, out_features=(8, 8), ranks=[4], num_rows=5,
        dist="uniform", none_share=0.0, seed=5,
    )  # fmt: skip
    backend = TorchLoraBackend()
    meta = backend.build_meta(torch.tensor(case.row_slot, dtype=torch.int32),
                              LoraMetaBuffers(5, case.table.num_slots, "cpu"))  # fmt: skip
    assert backend.add_lora_silu_mul(case.y0, case.x, meta, case.table.weights) is None


@pytest.mark.parametrize("prefetch", [False, True], ids=["in-turn", "prefetch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expand_silu_column_spans_and_rank_chunks(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, prefetch: bool
) -> None:
    """Several column tiles per program and several column programs (I off the tile),
    8-row tiles (slots spanning tiles, a long ``-1`` run) and ranks beyond one chunk;
    each column tile's loads in turn, or the next tile's issued ahead (``y_prefetch``)."""
    from dataplane.kernels.triton import configs

    rows = 30
    t_key = configs.bucket(rows, configs.T_BUCKETS)
    tile = configs.ExpandConfig(8, 16, 16, 4, 2, 3, y_prefetch=prefetch)
    monkeypatch.setitem(configs.SILU_TABLE, t_key, tile)
    case = make_case(
        dtype=dtype, in_features=40, out_features=(100, 100), ranks=[33, 4, 16],
        num_rows=rows, dist="zipf1.5", none_share=0.4, seed=23, device=TRITON_DEVICE,
        absent_every=4,
    )  # fmt: skip
    act, _ = _run(case, fused=False)
    assert act is not None
    ref = _reference(case)
    err = (act.double().cpu() - ref).norm() / ref.norm()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"
