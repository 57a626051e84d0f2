"""Host-to-device helpers: same values, dtype and device as the plain conversions (the
CUDA case, pinned staging + non_blocking, runs where CUDA is present)."""

from __future__ import annotations

import pytest
import torch

from dataplane.h2d import to_device, upload

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_to_device_equals_torch_tensor(device: str) -> None:
    for values, dtype in (([3, 1, 4, 1, 5], torch.int64), ([[1, 2], [3, 4]], torch.int32),
                          ([], torch.int64)):
        got = to_device(values, dtype, device)
        assert got.device.type == device and got.dtype == dtype
        assert torch.equal(got.cpu(), torch.tensor(values, dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_upload_equals_to(device: str) -> None:
    t = torch.arange(12, dtype=torch.int64).view(3, 4)[1:]
    got = upload(t, torch.device(device))
    assert got.device.type == device and torch.equal(got.cpu(), t)
    # many back-to-back copies of changing host data land intact (staging reuse)
    outs = [to_device(list(range(i, i + 64)), torch.int64, device) for i in range(50)]
    for i, out in enumerate(outs):
        assert torch.equal(out.cpu(), torch.arange(i, i + 64))
