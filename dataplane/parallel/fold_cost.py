"""Whether an engine (one GPU or a TP rank) should fold its LoRA into the base GEMMs for
decode steps.

The fold (dataplane/layers/lora_fold_store.py) replaces a decode step's four LoRA
launches per layer with work inside the base GEMMs and their consumer ops, but its GEMMs
read the ``A`` of every *fold slot*, used by a row or not. The fold holds
``F = min(max_slots, max_num_seqs)`` slots (dataplane/layers/lora_fold_slots.py: no step
can use more). With `active` distinct adapters per step (by default ``F``: every row on its
own adapter), per decode step:

    saved = layers * (4 * LAUNCH_S - FOLD_CONSUMER_S)
    extra = (F - active) * A bytes per slot / HBM_BYTES_PER_S

and the fold pays when ``extra < saved``: with 8B-shaped TP=2 rank-16 adapters, up to ~100
idle fold slots. Its copies of the fold slots' factors (`fold_resident_bytes`) must also
fit the agent's per-rank budget for extra resident factor bytes, when one is set.

On the CPU a step has no kernel launches to save, so the fold only widens the GEMMs (every
row against every fold slot's ``A``) and gathers each row's ``B`` in its consumer op,
where the torch backend's grouped path (dataplane/kernels/torch_grouped.py) reads each
factor once: it is off there (`bench/cpu_serving_step.py --arms agent+lora
agent+lora+fold` measures both).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.intmath import next_pow2
from dataplane.models.config import ModelConfig

HBM_BYTES_PER_S = 4073e9
"""H200 device copy bandwidth as a plain copy reaches it (spec 4.8 TB/s; measured:
docs/PERFORMANCE.md, "Engine")."""

LAUNCH_S = 9.4e-6
"""Median fused LoRA launch of a TP=2 decode step on an H200 (128 per step, 16 live slots;
docs/PERFORMANCE.md, "Tensor parallel")."""
FOLD_CONSUMER_S = 13.3e-6
"""What the fold adds per layer beyond the factor bytes: RoPE, the two add-RMSNorms and
SiLU·mul with the expand folded in (+426 µs of such kernels per 32-layer TP=2 decode step
on an H200; docs/PERFORMANCE.md, "Tensor parallel")."""


@dataclass(frozen=True)
class FoldDecision:
    fold: bool
    reason: str
    saved_s: float
    extra_s: float


def fold_a_bytes_per_slot(config: ModelConfig, tp_size: int, rank: int,
                          dtype_bytes: int = 2) -> int:
    """One slot's ``A`` rows under every layer's weights on one rank (default layout:
    q/k/v and gate/up replicate ``A``, o and down shard its input), rank padded to a power
    of two as the fold stores it."""
    c, r = config, next_pow2(rank)
    per_layer = r * (3 * c.hidden_size + 2 * c.hidden_size + c.q_size // tp_size
                     + c.intermediate_size // tp_size)
    return per_layer * c.num_layers * dtype_bytes


def fold_resident_bytes(config: ModelConfig, tp_size: int, rank: int, fold_slots: int,
                        dtype_bytes: int = 2) -> int:
    """What the fold allocates on one rank: each fold slot's padded ``A`` rows and ``B``
    (q/k/v and gate/up ``B`` output-sharded, o and down ``B`` replicated) in every layer."""
    c, r = config, next_pow2(rank)
    kv_local = max(c.kv_size // tp_size, c.head_dim)  # one replicated kv head at least
    b_per_layer = r * (c.q_size // tp_size + 2 * kv_local + c.hidden_size
                       + 2 * c.intermediate_size // tp_size + c.hidden_size)
    b_bytes = b_per_layer * c.num_layers * dtype_bytes
    return fold_slots * (fold_a_bytes_per_slot(config, tp_size, rank, dtype_bytes) + b_bytes)


def decide_fold(config: ModelConfig, tp_size: int, *, rank: int, max_slots: int,
                max_num_seqs: int, active: int | None = None, dtype_bytes: int = 2,
                extra_resident_budget_bytes: int | None = None, device: str = "cuda"
                ) -> FoldDecision:
    """The module docstring's rule (`device`: the engine's device type)."""
    if device != "cuda":
        return FoldDecision(False, f"no kernel launches to save on {device}", 0.0, 0.0)
    fold_slots = min(max_slots, max_num_seqs)
    if extra_resident_budget_bytes is not None:
        resident = fold_resident_bytes(config, tp_size, rank, fold_slots, dtype_bytes)
        if resident > extra_resident_budget_bytes:
            return FoldDecision(False, f"fold copies ({resident} bytes) exceed the "
                                       "resident-bytes budget", 0.0, 0.0)
    active = fold_slots if active is None else min(active, fold_slots)
    saved = config.num_layers * (4 * LAUNCH_S - FOLD_CONSUMER_S)
    extra = ((fold_slots - active) * fold_a_bytes_per_slot(config, tp_size, rank, dtype_bytes)
             / HBM_BYTES_PER_S)
    if extra < saved:
        return FoldDecision(True, f"idle fold slots' A reads {extra * 1e6:.0f} µs < "
                                  f"{saved * 1e6:.0f} µs of launches saved", saved, extra)
    return FoldDecision(False, f"idle fold slots' A reads {extra * 1e6:.0f} µs >= "
                               f"{saved * 1e6:.0f} µs of launches saved", saved, extra)
