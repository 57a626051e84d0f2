"""When a TP rank folds its LoRA into the base GEMMs (dataplane/parallel/fold_cost.py):
the idle fold slots' A reads against the decode launches the fold saves."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dataplane.models.config import ModelConfig
from dataplane.parallel.fold_cost import decide_fold, fold_a_bytes_per_slot

LLAMA_8B = ModelConfig.from_dict({
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": False})


def test_a_bytes_per_slot_on_a_tp2_rank() -> None:
    # rank 16, bf16, per layer: q/k/v and gate/up A replicated (5 x 16 x 4,096), o's A
    # sharded (16 x 2,048), down's A sharded (16 x 7,168)
    per_layer = 16 * (5 * 4096 + 2048 + 7168) * 2
    assert fold_a_bytes_per_slot(LLAMA_8B, 2, 16) == 32 * per_layer == 30_408_704
    assert fold_a_bytes_per_slot(LLAMA_8B, 2, 12) == 32 * per_layer  # padded to 16


@pytest.mark.parametrize(("max_slots", "folds"), [(64, True), (128, True), (160, True),
                                                  (176, False), (256, False)])
def test_fold_pays_until_idle_fold_slot_reads_exceed_the_launches(max_slots: int,
                                                                  folds: bool) -> None:
    """256 rows per step, 64 adapters live in each: the fold holds min(max_slots, 256)
    slots, so 128 slots leave 64 idle (30.4 MB of A each per step, 4,073 GB/s: 478 µs)
    against 32 x (4 x 9.4 - 13.3) = 777.6 µs saved; the break-even is 104 idle."""
    d = decide_fold(LLAMA_8B, 2, rank=16, max_slots=max_slots, max_num_seqs=256, active=64)
    idle = max_slots - 64
    extra = Fraction(idle * 30_408_704) / Fraction(4073 * 10**9)
    assert d.extra_s == pytest.approx(float(extra))
    assert d.saved_s == pytest.approx(777.6e-6)
    assert d.fold is folds
    assert ("<" in d.reason) is folds


@pytest.mark.parametrize("max_slots", [16, 64, 128, 1000])
def test_the_fold_holds_no_more_slots_than_a_step_has_rows(max_slots: int) -> None:
    """64 rows per step: the fold holds min(max_slots, 64) slots, every one of them live
    when each row is on its own adapter (the default `active`), whatever max_slots is."""
    d = decide_fold(LLAMA_8B, 2, rank=16, max_slots=max_slots, max_num_seqs=64)
    assert d.fold and d.extra_s == 0.0
    few = decide_fold(LLAMA_8B, 2, rank=16, max_slots=max_slots, max_num_seqs=64, active=8)
    assert few.extra_s == pytest.approx((min(max_slots, 64) - 8) * 30_408_704 / 4073e9)


@pytest.mark.parametrize(("max_slots", "fold_slots"), [(8, 8), (128, 64)])
def test_fold_copies_must_fit_the_resident_budget(max_slots: int, fold_slots: int) -> None:
    # per fold slot: A 30,408,704 bytes; B per layer 16 x (3,072 + 4,096 + 14,336 + 4,096)
    # x 2; 64 rows per step: min(max_slots, 64) fold slots
    b = 32 * 16 * (3072 + 4096 + 14336 + 4096) * 2
    assert b == 26_214_400
    per_slot = 30_408_704 + b
    fits = decide_fold(LLAMA_8B, 2, rank=16, max_slots=max_slots, max_num_seqs=64,
                       extra_resident_budget_bytes=fold_slots * per_slot)
    over = decide_fold(LLAMA_8B, 2, rank=16, max_slots=max_slots, max_num_seqs=64,
                       extra_resident_budget_bytes=fold_slots * per_slot - 1)
    assert fits.fold and not over.fold and "budget" in over.reason
