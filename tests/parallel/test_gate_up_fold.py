"""The column-parallel gate/up shard folds its LoRA expand into SiLU·mul, as on one GPU.

Two real gloo ranks, gate/up 16 -> 2 x 24 (each rank a `LoRALinear` of 12 + 12 columns
holding A whole and its 12 rows of each B), three adapters of mixed ranks (one without
up_proj), rows of every slot and rows without one. Reference: float64
``silu(x Wg^T + s (x Ag^T) Bg^T) * (x Wu^T + s (x Au^T) Bu^T)`` per row, written here.
On the Triton kernels (CPU interpreter) the backend's fold runs on the rank's shard; the
torch backend has no fold (``add_lora``, then SiLU·mul) and matches too. Neither sends
anything: a column shard's input is replicated.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from .dist_harness import run_world

HIDDEN, INTER = 16, 24
ROW_SLOT = [0, 1, -1, 2, 0, 2, -1, 1, 1, 0, 2]
ADAPTERS = {0: (4, 0.5, (0, 1)), 1: (8, 2.0, (0,)), 2: (2, 1.0, (0, 1))}
BACKENDS = ("triton", "torch")


def _payload() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    adapters = {
        slot: {k: (torch.randn(r, HIDDEN, generator=gen) / 4, torch.randn(INTER, r, generator=gen),
                   scale) for k in slices}
        for slot, (r, scale, slices) in ADAPTERS.items()}
    return {"hidden": HIDDEN, "inter": INTER, "row_slot": ROW_SLOT, "adapters": adapters,
            "x": torch.randn(len(ROW_SLOT), HIDDEN, generator=gen),
            "w_gu": torch.randn(2 * INTER, HIDDEN, generator=gen) / 4,
            "num_slots": 3, "max_rank": 8}


PAYLOAD = _payload()


def reference(p: dict[str, Any], with_lora: bool = True) -> torch.Tensor:
    x = p["x"].double()
    y = x @ p["w_gu"].double().T
    for t, slot in enumerate(p["row_slot"]):
        if slot < 0 or not with_lora:
            continue
        for k, (a, b, scale) in p["adapters"][slot].items():
            y[t, k * INTER:(k + 1) * INTER] += scale * (x[t] @ a.double().T) @ b.double().T
    return F.silu(y[:, :INTER]) * y[:, INTER:]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_world("tests.parallel.scenarios_gate_up:run", PAYLOAD, timeout_s=240.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gate_up_shards_match_global_activation(ranks: list[dict[str, Any]],
                                                backend: str) -> None:
    assert all(ranks[j][backend]["local_widths"] == (INTER // 2, INTER // 2) for j in range(2))
    got = torch.cat([ranks[j][backend]["act"] for j in range(2)], dim=1)  # output-sharded
    torch.testing.assert_close(got.double(), reference(PAYLOAD), rtol=1e-5, atol=1e-5)
    base = torch.cat([ranks[j][backend]["base_act"] for j in range(2)], dim=1)
    torch.testing.assert_close(base.double(), reference(PAYLOAD, with_lora=False),
                               rtol=1e-5, atol=1e-5)
    rows = [t for t, s in enumerate(ROW_SLOT) if s < 0]
    if backend == "torch":  # no adapter: exactly the base (add_lora leaves those rows)
        assert torch.equal(got[rows], base[rows])
    else:  # the fold kernel's own SiLU·mul: the base within one float32 rounding
        torch.testing.assert_close(got[rows], base[rows], rtol=0, atol=1e-6)
    assert not torch.allclose(got, base, atol=1e-3)  # the adapters do change the output


def test_triton_folds_the_expand_on_the_shard_without_collective(
        ranks: list[dict[str, Any]]) -> None:
    for j in range(2):
        assert ranks[j]["triton"]["folded"] == [True]
        assert ranks[j]["torch"]["folded"] == [False]  # asked, no such path: add_lora
        for backend in BACKENDS:
            assert ranks[j][backend]["counts"]["calls"] == 0
