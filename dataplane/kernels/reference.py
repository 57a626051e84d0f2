"""Float64 reference of the multi-adapter LoRA branch: one row at a time.

Deliberately independent of the tables, metadata and kernels: it takes the
factors in PEFT orientation per slot and loops over rows, so it is obviously
right and serves as the oracle for both backends: an oracle, never a fast path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

# factors[slot][k] = (A [r, d_in], B [w_k, r], scale); a missing slice = rank 0.
SlotFactors = Mapping[int, tuple[torch.Tensor, torch.Tensor, float]]


def lora_delta_reference(
    x: torch.Tensor,
    row_slot: Sequence[int],
    factors: Mapping[int, SlotFactors],
    out_features: Sequence[int],
) -> torch.Tensor:
    """Return the float64 delta ``[T, sum(out_features)]`` in scheduler row order.

    Row ``t`` with slot ``s >= 0`` gets, per slice ``k`` present in
    ``factors[s]``, ``scale * (x[t] @ A.T) @ B.T`` in columns of slice ``k``;
    slot ``-1`` rows and absent slices stay exactly zero.
    """
    x64 = x.detach().to("cpu", torch.float64)
    offsets = [sum(out_features[:k]) for k in range(len(out_features))]
    delta = torch.zeros(x64.shape[0], sum(out_features), dtype=torch.float64)
    for t, slot in enumerate(row_slot):
        if slot < 0:
            continue
        for k, (a, b, scale) in factors.get(slot, {}).items():
            z = x64[t] @ a.detach().to("cpu", torch.float64).T
            d = float(scale) * (z @ b.detach().to("cpu", torch.float64).T)
            delta[t, offsets[k] : offsets[k] + out_features[k]] += d
    return delta


def lora_delta_reference_grouped(
    x: torch.Tensor,
    row_slot: Sequence[int],
    factors: Mapping[int, SlotFactors],
    out_features: Sequence[int],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Same contract as :func:`lora_delta_reference`, vectorised per slot for
    large shapes (GPU tests); float64 on ``device``."""
    x64 = x.detach().to(device, torch.float64)
    offsets = [sum(out_features[:k]) for k in range(len(out_features))]
    delta = torch.zeros(x64.shape[0], sum(out_features), dtype=torch.float64, device=device)
    slots = torch.tensor(list(row_slot), dtype=torch.int64, device=device)
    for slot, per_slice in factors.items():
        rows = (slots == slot).nonzero().flatten()
        if rows.numel() == 0:
            continue
        for k, (a, b, scale) in per_slice.items():
            a64 = a.detach().to(device, torch.float64)
            b64 = b.detach().to(device, torch.float64)
            d = float(scale) * ((x64[rows] @ a64.T) @ b64.T)
            delta[rows, offsets[k] : offsets[k] + out_features[k]] = d
    return delta
