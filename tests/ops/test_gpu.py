"""GPU tests (marked `gpu`, skipped without CUDA): the compiled Triton kernels against the
torch references in bf16 at Llama-3-8B sizes, and inside a captured CUDA graph.

Run on the device: `python -m pytest tests/ops -m gpu`.
"""

from __future__ import annotations

import pytest
import torch

from dataplane.ops import fused_add_rms_norm, rms_norm, rope_and_cache, silu_and_mul

pytestmark = pytest.mark.gpu

BF16 = dict(atol=2e-2, rtol=2e-2)
T, HIDDEN, INTER, HQ, HKV, D = 64, 4096, 14336, 32, 8, 128


def _randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)


def test_norms_bf16_match_torch(cuda_device: torch.device) -> None:
    torch.manual_seed(0)
    x, r, w = _randn(T, HIDDEN), _randn(T, HIDDEN, scale=3), _randn(HIDDEN)
    torch.testing.assert_close(rms_norm(x, w, 1e-5, "triton"), rms_norm(x, w, 1e-5, "torch"),
                               **BF16)
    want_y, want_r = fused_add_rms_norm(x.clone(), r.clone(), w, 1e-5, "torch")
    got_y, got_r = fused_add_rms_norm(x.clone(), r.clone(), w, 1e-5, "triton")
    assert torch.equal(got_r, want_r)  # the residual add is one bf16 rounding on both paths
    torch.testing.assert_close(got_y, want_y, **BF16)


def test_silu_mul_bf16_matches_torch(cuda_device: torch.device) -> None:
    torch.manual_seed(1)
    gate_up = _randn(T, 2 * INTER, scale=3)
    torch.testing.assert_close(silu_and_mul(gate_up, "triton"), silu_and_mul(gate_up, "torch"),
                               **BF16)


def test_rope_and_cache_bf16_matches_torch(cuda_device: torch.device) -> None:
    torch.manual_seed(2)
    qkv = _randn(T, (HQ + 2 * HKV) * D)
    angles = torch.rand(T, D // 2, device="cuda") * 100
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    slots = torch.randperm(200, device="cuda")[:T]
    results = []
    for backend in ("torch", "triton"):
        buf = qkv.clone()
        q = buf[:, :HQ * D].view(T, HQ, D)
        k = buf[:, HQ * D:(HQ + HKV) * D].view(T, HKV, D)
        v = buf[:, (HQ + HKV) * D:].view(T, HKV, D)
        kc = torch.zeros(201, HKV, D, dtype=torch.bfloat16, device="cuda")
        vc = torch.zeros_like(kc)
        q2, k2 = rope_and_cache(q, k, v, cos, sin, kc, vc, slots, backend)
        results.append((q2, k2, kc, vc))
    (q_t, k_t, kc_t, vc_t), (q_g, k_g, kc_g, vc_g) = results
    torch.testing.assert_close(q_g, q_t, **BF16)
    torch.testing.assert_close(k_g, k_t, **BF16)
    torch.testing.assert_close(kc_g, kc_t, **BF16)
    assert torch.equal(vc_g, vc_t)


def test_ops_replay_in_cuda_graph(cuda_device: torch.device) -> None:
    """Captured once, replayed on new inputs written into the static buffers."""
    torch.manual_seed(3)
    x, r, w = _randn(T, HIDDEN), _randn(T, HIDDEN), _randn(HIDDEN)
    gate_up = _randn(T, 2 * INTER)
    static = [x.clone(), r.clone(), gate_up.clone()]

    def run() -> tuple[torch.Tensor, ...]:
        y, summed = fused_add_rms_norm(static[0], static[1], w, 1e-5, "triton")
        return rms_norm(summed, w, 1e-5, "triton"), y, silu_and_mul(static[2], "triton")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    new_x, new_r, new_gu = _randn(T, HIDDEN), _randn(T, HIDDEN), _randn(T, 2 * INTER)
    static[0].copy_(new_x)
    static[1].copy_(new_r)
    static[2].copy_(new_gu)
    graph.replay()
    torch.cuda.synchronize()
    want_y, want_sum = fused_add_rms_norm(new_x, new_r, w, 1e-5, "torch")
    torch.testing.assert_close(outs[0], rms_norm(want_sum, w, 1e-5, "torch"), **BF16)
    torch.testing.assert_close(outs[1], want_y, **BF16)
    torch.testing.assert_close(outs[2], silu_and_mul(new_gu, "torch"), **BF16)
