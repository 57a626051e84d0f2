"""Sampling: the torch `Sampler` (lazy import) and torch-free stop rules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dataplane.sampling.stop_checker import StopChecker

if TYPE_CHECKING:
    from dataplane.sampling.sampler import PendingSample, Sampler, SampleResult, TokenLogprobs

__all__ = ["PendingSample", "SampleResult", "Sampler", "StopChecker", "TokenLogprobs"]


def __getattr__(name: str) -> Any:
    if name in ("PendingSample", "Sampler", "SampleResult", "TokenLogprobs"):
        from dataplane.sampling import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module 'dataplane.sampling' has no attribute {name!r}")
