"""`apply_bitmask` on CUDA (imports only torch and the grammar module, so the GPU host needs
llguidance and nothing of the CPU tests' extras)."""

from __future__ import annotations

import pytest
import torch

from dataplane.sampling.grammar import allocate_bitmask, apply_bitmask


@pytest.mark.gpu
def test_apply_bitmask_on_cuda_equals_the_host(cuda_device: torch.device) -> None:
    """The device path (pinned staging upload, one gather / fill / scatter) masks exactly
    what the host path does, for a 128k-wide logits row set."""
    gen = torch.Generator().manual_seed(1)
    vocab = 128256
    logits = torch.randn(64, vocab, generator=gen)
    bitmask = allocate_bitmask(40, vocab - 64)
    bitmask.copy_(torch.randint(-2**31, 2**31 - 1, bitmask.shape, generator=gen,
                                dtype=torch.int64).to(torch.int32))
    rows = [*range(0, 62, 2), 63]
    on_device = logits.to(cuda_device)
    apply_bitmask(logits, bitmask, rows)
    apply_bitmask(on_device, bitmask, rows)
    assert torch.equal(on_device.cpu(), logits)
