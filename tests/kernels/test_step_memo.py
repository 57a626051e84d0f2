"""The Triton backend's per-step memo (step_memo.py): layers sharing one step's metadata
reuse the first call's prepared launches, and still get their own factors, inputs and
outputs; a call that does not match is validated afresh; a new step starts empty."""

from __future__ import annotations

import pytest
import torch

from dataplane.kernels import LoraMetaBuffers, LoraWorkspace
from dataplane.kernels.errors import LoraShapeError
from dataplane.kernels.triton.backend import TritonLoraBackend

from .conftest import CPU_BACKENDS
from .lora_cases import TOLERANCE, LoraCase, enable_folded_silu, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CUDA: the fast launches too
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and "triton" not in CPU_BACKENDS,
                                reason="needs CUDA or TRITON_INTERPRET=1 (the CPU suite)")

ROWS = 40  # a decode-sized step: the fused launch, or two kernels with it off


def _case(seed: int, outs: tuple[int, ...]) -> LoraCase:
    return make_case(dtype=torch.float32, in_features=32, out_features=outs, ranks=[4, 8],
                     num_rows=ROWS, dist="uniform", none_share=0.2, seed=seed, device=DEVICE)


def _slots(case: LoraCase) -> torch.Tensor:
    return torch.tensor(case.row_slot, dtype=torch.int32, device=DEVICE)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.to(got.device)
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("fused", [False, True], ids=["two-kernel", "fused"])
@pytest.mark.parametrize("outs", [(32, 16, 16), (16, 16)], ids=["qkv", "gate_up"])
def test_layers_of_one_step_share_the_prepared_launches(outs: tuple[int, ...],
                                                        fused: bool) -> None:
    backend = TritonLoraBackend(fused=fused)
    first, second = _case(1, outs), _case(2, outs)
    second.row_slot = first.row_slot  # one step: both "layers" see the same grouping
    buffers = LoraMetaBuffers(ROWS, first.table.num_slots, DEVICE)
    meta = backend.build_meta(_slots(first), buffers)
    w = first.table.weights
    ws = LoraWorkspace(backend.workspace_numel(ROWS, w.num_slices, w.max_rank), DEVICE)
    for case in (first, second, first):
        y = case.y0.clone()
        backend.add_lora(y, case.x, meta, case.table.weights, ws)
        assert _relative_error(y, case.reference()) < TOLERANCE[torch.float32]
    assert len(backend.memo.entries) == 1
    assert next(iter(backend.memo.entries.values())).fused is fused

    bad = first.x[:-1]  # another row count under the same metadata: validated, refused
    with pytest.raises(LoraShapeError):
        backend.add_lora(first.y0[:-1].clone(), bad, meta, w, ws)

    meta2 = backend.build_meta(_slots(first), buffers)
    y = first.y0.clone()
    backend.add_lora(y, first.x, meta2, w, ws)
    assert backend.memo.meta is meta2 and len(backend.memo.entries) == 1
    assert _relative_error(y, first.reference()) < TOLERANCE[torch.float32]


def test_folded_silu_layers_share_the_prepared_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    enable_folded_silu(monkeypatch)
    backend = TritonLoraBackend(fused=False)
    first, second = _case(3, (16, 16)), _case(4, (16, 16))
    second.row_slot = first.row_slot
    buffers = LoraMetaBuffers(ROWS, first.table.num_slots, DEVICE)
    meta = backend.build_meta(_slots(first), buffers)
    w = first.table.weights
    ws = LoraWorkspace(backend.workspace_numel(ROWS, w.num_slices, w.max_rank), DEVICE)
    for case in (first, second):
        out = backend.add_lora_silu_mul(case.y0.clone(), case.x, meta, case.table.weights, ws)
        assert out is not None
        ref = case.reference().to(DEVICE)
        want = torch.nn.functional.silu(ref[:, :16]) * ref[:, 16:]
        assert _relative_error(out, want) < TOLERANCE[torch.float32]
    assert len(backend.memo.entries) == 1
