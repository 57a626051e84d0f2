"""Default exactness-gate thresholds per release dtype (torch-free: the API reads them at
submission; `gate.py` applies them on the worker).

Each bounds the maximum relative logit error between the merged checkpoint and the base
with its adapters applied live, and follows the release dtype's precision: float32
(2⁻²⁴ relative rounding) 1/10⁴, float16 (2⁻¹¹) 1/100, bfloat16 (2⁻⁸) 1/20. On the tiny
test Llama the measured errors are about 4·10⁻⁷, 6·10⁻⁴ and 5·10⁻³.
"""

from __future__ import annotations

from fractions import Fraction

THRESHOLDS: dict[str, Fraction] = {
    "fp32": Fraction(1, 10_000), "fp16": Fraction(1, 100), "bf16": Fraction(1, 20)}
