"""CUDA path: pinned host tier, side-stream copy with a recorded event (GPU only)."""

from __future__ import annotations

import pytest
import torch

from dataplane.pool.device_pool import DevicePool
from dataplane.pool.host_tier import HostTier
from dataplane.pool.page_storage import CudaEvent
from dataplane.pool.transactions import LoadRequest, LoadTransaction

from .builders import SLORA_GEOMETRY, packed

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_stream_copy_publishes_after_event() -> None:
    host = HostTier(1 << 20, pin_memory=True)
    img = packed("a", 0)
    host.put(img)
    pool = DevicePool(SLORA_GEOMETRY, 16, 2, torch.float16, "cuda", host_tier=host)
    assert host.peek("a") is not None and host.pinned_count == 1
    txn = LoadTransaction(pool, LoadRequest("a", request_id="r", kv_initial=1))
    txn.begin()
    txn.start_copy()
    assert isinstance(txn.event, CudaEvent)
    txn.validate()
    adm = txn.publish()
    assert torch.equal(pool.storage.read(adm.adapter_pages).cpu(), img.payload)
    pool.check()
