"""The exactness gate: a merged checkpoint is released only if it computes what the base
with its adapters applied live computes, on a fixed probe set.

Both sides run the HF model (`transformers`) in float32 on CPU:
- live: the clean base, with a forward hook on every adapted projection adding
  Σ_i c_i · (x A_iᵀ) B_iᵀ (the adapters' factors in float32, release order);
- merged: the written checkpoint, upcast from the release dtype to float32.

The error of one probe is max|L_merged − L_live| / max|L_live| over its logits; the gate
records every probe's error and their maximum, and refuses the release when the maximum
exceeds the dtype's threshold (`thresholds.THRESHOLDS`, or the request's own). The only
differences are the float32 rounding of the two association orders and the release
rounding.

Memory: one model at a time in float32 (the live pass finishes before the merged model
is loaded), plus the adapters' factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from controlplane.merges.compute import MergeAdapter
from dataplane.identity import digest

PROBE_COUNT = 4
PROBE_LENGTH = 12


def probe_prompts(vocab_size: int) -> list[list[int]]:
    """Fixed token-id prompts spread over the vocabulary (deterministic, no tokenizer)."""
    return [[(17 * p + 31 * i * (p + 1) + 1) % vocab_size for i in range(PROBE_LENGTH)]
            for p in range(PROBE_COUNT)]


@dataclass(frozen=True)
class GateResult:
    max_relative_error: float
    per_probe: list[float]
    threshold: Fraction
    probes_sha256: str

    @property
    def passed(self) -> bool:
        return Fraction(self.max_relative_error) <= self.threshold

    def metrics(self) -> dict[str, Any]:
        return {"max_relative_error": self.max_relative_error,
                "per_probe_relative_error": self.per_probe,
                "threshold": f"{self.threshold.numerator}/{self.threshold.denominator}",
                "probes": len(self.per_probe), "probe_length": PROBE_LENGTH,
                "probes_sha256": self.probes_sha256, "passed": self.passed}


def _load(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


def _logits(model: Any, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(torch.tensor([list(p)])).logits[0].to(torch.float32) for p in prompts]


def live_logits(base_dir: Path, adapters: Sequence[MergeAdapter],
                prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Logits of the clean base with every adapter applied live, in float32."""
    model = _load(base_dir)
    hooks = []
    for module in sorted(set().union(*(a.modules for a in adapters))):
        deltas = [a.delta(module) for a in adapters if module in a.modules]
        factors = [(d.a.to(torch.float32), d.b.to(torch.float32), d.scale) for d in deltas]

        def add_live(_mod: Any, inputs: Any, output: torch.Tensor,
                     factors: list[tuple[torch.Tensor, torch.Tensor, float]] = factors
                     ) -> torch.Tensor:
            x = inputs[0]
            for a, b, scale in factors:
                output = output + ((x @ a.T) @ b.T) * scale
            return output

        hooks.append(model.get_submodule(module).register_forward_hook(add_live))
    try:
        return _logits(model, prompts)
    finally:
        for hook in hooks:
            hook.remove()
        del model


def relative_errors(merged: Sequence[torch.Tensor],
                    live: Sequence[torch.Tensor]) -> list[float]:
    return [float((m - ref).abs().max() / ref.abs().max())
            for m, ref in zip(merged, live, strict=True)]


def exactness_gate(base_dir: Path, merged_dir: Path, adapters: Sequence[MergeAdapter],
                   vocab_size: int, threshold: Fraction) -> GateResult:
    prompts = probe_prompts(vocab_size)
    live = live_logits(base_dir, adapters, prompts)
    merged_model = _load(merged_dir)
    try:
        merged = _logits(merged_model, prompts)
    finally:
        del merged_model
    errors = relative_errors(merged, live)
    return GateResult(max(errors), errors, threshold, digest(prompts))
