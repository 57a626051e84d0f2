"""Random multi-adapter cases in the style of Punica's tests (shared by CPU and GPU tests).

A case = slot table (per slot: rank per slice, or absent slice), row → slot map
drawn from one of Punica's adapter distributions, a share of no-adapter rows,
inputs, and the float64 reference delta.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.kernels import (
    LoraBackend,
    LoraFactorTable,
    LoraMetaBuffers,
    LoraWorkspace,
)
from dataplane.kernels.reference import SlotFactors, lora_delta_reference

DISTRIBUTIONS = ("distinct", "uniform", "zipf1.5", "identical", "skewed")
# ‖out − ref‖ / ‖ref‖ bounds per dtype (bf16 z is rounded once before expand).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def draw_slots(dist: str, num_rows: int, num_slots: int, gen: torch.Generator) -> list[int]:
    """Row → slot in scheduler order for one of Punica's distributions."""
    if dist == "distinct":
        slots = [t % num_slots for t in range(num_rows)]
    elif dist == "uniform":
        slots = torch.randint(num_slots, (num_rows,), generator=gen).tolist()
    elif dist == "zipf1.5":
        w = 1.0 / torch.arange(1, num_slots + 1, dtype=torch.float64) ** 1.5
        slots = torch.multinomial(w, num_rows, replacement=True, generator=gen).tolist()
    elif dist == "identical":
        slots = [num_slots - 1] * num_rows
    elif dist == "skewed":  # one hot adapter, a tail of singletons
        slots = [0 if t % 4 else 1 + (t // 4) % (num_slots - 1) for t in range(num_rows)]
    else:
        raise ValueError(dist)
    order = torch.randperm(num_rows, generator=gen).tolist()
    return [slots[i] for i in order]


@dataclass
class LoraCase:
    x: torch.Tensor
    y0: torch.Tensor
    row_slot: list[int]
    table: LoraFactorTable
    factors: dict[int, SlotFactors]
    out_features: tuple[int, ...]

    def reference(self) -> torch.Tensor:
        """Expected ``y`` in float64."""
        delta = lora_delta_reference(self.x, self.row_slot, self.factors, self.out_features)
        return self.y0.double().cpu() + delta

    def run(self, backend: LoraBackend) -> torch.Tensor:
        device = self.x.device
        buffers = LoraMetaBuffers(len(self.row_slot) + 3, self.table.num_slots, device)
        row_slot = torch.tensor(self.row_slot, dtype=torch.int32, device=device)
        meta = backend.build_meta(row_slot, buffers)
        w = self.table.weights
        ws = LoraWorkspace(
            backend.workspace_numel(len(self.row_slot), w.num_slices, w.max_rank), device
        )
        y = self.y0.clone()
        backend.add_lora(y, self.x, meta, w, ws)
        return y


def make_case(
    *,
    dtype: torch.dtype,
    in_features: int,
    out_features: tuple[int, ...],
    ranks: list[int],
    num_rows: int,
    dist: str,
    none_share: float,
    seed: int,
    device: torch.device | str = "cpu",
    layout: str = "scattered",
    absent_every: int = 0,
    max_slots: int = 64,
) -> LoraCase:
    """Build a case; slot ``s`` has rank ``ranks[s % len(ranks)]`` on every slice,
    except that with ``absent_every = k > 0`` slot ``s`` lacks slice ``s % NS``
    whenever ``s % k == 0`` (a module absent for that adapter)."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = min(num_rows, max_slots) if dist == "distinct" else max(2, min(8, num_rows))
    max_rank = max(ranks)
    table = LoraFactorTable(
        num_slots, in_features, out_features, max_rank, dtype, device, layout, seed
    )
    factors: dict[int, SlotFactors] = {}
    for s in range(num_slots):
        r = ranks[s % len(ranks)]
        per_slice = {}
        for k, width in enumerate(out_features):
            if absent_every and s % absent_every == 0 and k == s % len(out_features):
                continue
            a = (torch.randn(r, in_features, generator=gen) / in_features**0.5).to(dtype)
            b = (torch.randn(width, r, generator=gen) / r**0.5).to(dtype)
            scale = float(torch.empty(1).uniform_(0.25, 2.0, generator=gen))
            per_slice[k] = (a, b, scale)
        factors[s] = per_slice
        table.set_slot(s, per_slice)
    row_slot = draw_slots(dist, num_rows, num_slots, gen)
    none = torch.rand(num_rows, generator=gen) < none_share
    row_slot = [-1 if none[t] else s for t, s in enumerate(row_slot)]
    x = torch.randn(num_rows, in_features, generator=gen).to(dtype).to(device)
    y0 = torch.randn(num_rows, sum(out_features), generator=gen).to(dtype).to(device)
    return LoraCase(x, y0, row_slot, table, factors, out_features)


def check_case(case: LoraCase, backend: LoraBackend) -> None:
    """Compare with the float64 reference; rows without a slot must be untouched."""
    y = case.run(backend)
    ref = case.reference()
    got = y.double().cpu()
    err = (got - ref).norm() / ref.norm()
    tol = TOLERANCE[case.x.dtype]
    assert torch.isfinite(got).all()
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"
    # Exact zero delta where there is no adapter, and where a slice is absent.
    offs = [sum(case.out_features[:k]) for k in range(len(case.out_features))]
    y0 = case.y0.cpu()
    for t, s in enumerate(case.row_slot):
        for k, width in enumerate(case.out_features):
            if s < 0 or k not in case.factors[s]:
                cols = slice(offs[k], offs[k] + width)
                assert torch.equal(y.cpu()[t, cols], y0[t, cols]), (t, s, k)


def enable_folded_silu(monkeypatch: object) -> None:
    """Turn on the gate/up expand folded into SiLU·mul for every T class (the committed
    table leaves it off where it is slower) with the plain expand's tiles."""
    import pytest

    from dataplane.kernels.triton import configs

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    for t in configs.T_BUCKETS:
        monkeypatch.setitem(configs.SILU_TABLE, t, configs.default_expand(t, 64))
