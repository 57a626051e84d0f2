"""Real PEFT adapters (mixed ranks and targets) through the pool into the kernels' tables.

The adapters are written by PEFT itself (``dataplane.assets``) and read by the engine's
validated reader; the reference is the kernels' float64 per-row oracle on those factors,
independent of page placement.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama
from dataplane.engine.adapters import load_peft_adapter
from dataplane.kernels.base import LoraMetaBuffers
from dataplane.kernels.reference import lora_delta_reference
from dataplane.kernels.torch_backend import TorchLoraBackend
from dataplane.models.config import ModelConfig
from dataplane.models.llama import LORA_GROUPS
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kernel_tables import KernelTables, ModuleGroup
from dataplane.pool.packing import factors_from_modules, pack_adapter
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.transactions import LoadRequest, admit

SPECS = {
    "attn_r4": dict(seed=11, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "all_r8": dict(seed=12, rank=8, alpha=16,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                   "up_proj", "down_proj"],
                   rank_pattern={"down_proj": 2}),
}


@pytest.fixture(scope="module")
def model_and_adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("pool-peft")
    model = make_tiny_llama(root / "base", seed=0)
    adapters = {n: make_peft_adapter(model, root / n, **s)  # type: ignore[arg-type]
                for n, s in SPECS.items()}
    return model, adapters


def test_real_adapters_through_pool_pages(model_and_adapters: tuple[Path, dict]) -> None:
    model_dir, paths = model_and_adapters
    config = ModelConfig.from_model_dir(model_dir)
    abi = read_base_abi(model_dir)
    loaded = {n: load_peft_adapter(p, abi, max_rank=8) for n, p in paths.items()}
    shapes = config.module_shapes
    widest = max(max(d_out, d_in) for d_out, d_in in shapes.values())
    geo = PageGeometry(page_elems=widest, elem_bytes=4)
    host = HostTier(1 << 26, pin_memory=False)
    for name, adapter in loaded.items():
        host.put(pack_adapter(name, factors_from_modules(adapter.modules), geo, torch.float32))
    demand = sum(host.peek(n).num_pages for n in loaded)  # type: ignore[union-attr]
    pool = DevicePool(geo, demand + 8, 2, torch.float32, host_tier=host)
    groups = [ModuleGroup(layer, attr, slices, shapes[slices[0]][1],
                          tuple(shapes[s][0] for s in slices))
              for layer in range(config.num_layers) for attr, slices in LORA_GROUPS.items()]
    tables = KernelTables(pool.storage, groups, 2, max_rank=8)
    pool.listeners.append(tables)
    slot = {n: admit(pool, LoadRequest(n)).handle.slot_id for n in loaded}
    pool.check()

    backend = TorchLoraBackend()
    row_slot = [slot["attn_r4"], slot["all_r8"], -1, slot["all_r8"]]
    meta = backend.build_meta(torch.tensor(row_slot), LoraMetaBuffers(4, 2, "cpu"))
    gen = torch.Generator().manual_seed(3)
    for g in groups:
        x = torch.randn(len(row_slot), g.in_features, generator=gen)
        y = torch.zeros(len(row_slot), sum(g.out_features))
        backend.add_lora(y, x, meta, tables.weights(g.layer, g.name))
        ref_factors = {
            slot[n]: {g.slices.index(m.module): (m.a, m.b, m.scale)
                      for m in a.modules if m.layer == g.layer and m.module in g.slices}
            for n, a in loaded.items()
        }
        ref = lora_delta_reference(x, row_slot, ref_factors, g.out_features)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
