"""`LaunchPlan` (triton_launch.py) on CUDA: the cached compiled kernel is only reused for
arguments Triton would specialize the same way, and launches land on the current stream
(CUDA-graph capture). Marked ``gpu``; the CPU suite runs Triton under the interpreter,
where every launch goes through ``kernel[grid]``."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dataplane.triton_launch import LaunchPlan, enabled

pytestmark = pytest.mark.gpu


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x * scale + y).to(out_ptr.dtype.element_ty), mask=mask)


def _run(plan: LaunchPlan, x: torch.Tensor, y: torch.Tensor, scale: int) -> torch.Tensor:
    out = torch.empty_like(y)
    plan((triton.cdiv(x.numel(), 128),), x, y, out, x.numel(), scale)
    return out


def test_reuses_compiled_kernel_only_for_same_specialization(cuda_device: torch.device) -> None:
    assert enabled()
    plan = LaunchPlan(_axpy, dict(BLOCK=128))
    base = torch.randn(4097, device=cuda_device)
    other = torch.randn(4097, device=cuda_device)
    cases = [
        (base[:4096], other[:4096]),  # aligned
        (base[1:4097], other[:4096]),  # x 4 bytes off 16-byte alignment
        (base[:4096], other[1:4097]),
        (base[:4096].half(), other[:4096].half()),  # another dtype
        (base[:4096], other[:4096]),  # aligned again: the first kernel, fast path
    ]
    for x, y in cases:
        for scale in (3, 3):  # the second launch of each takes the cached kernel
            got = _run(plan, x, y, scale)
            want = (x.double() * scale + y.double()).to(y.dtype)
            torch.testing.assert_close(got, want)
    assert len(plan.kernels) == 4  # aligned, x misaligned, y misaligned, fp16


def test_launches_on_the_current_stream_and_captures(cuda_device: torch.device) -> None:
    plan = LaunchPlan(_axpy, dict(BLOCK=128))
    x = torch.randn(1000, device=cuda_device)
    y = torch.randn(1000, device=cuda_device)
    out = torch.zeros_like(y)
    _run(plan, x, y, 2)  # compile + cache outside the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        plan((triton.cdiv(1000, 128),), x, y, out, 1000, 2)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.count_nonzero(out) == 0  # captured, not run
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 2 + y)
