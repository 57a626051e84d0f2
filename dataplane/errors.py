"""Typed errors of the engine core (stable `code`s) and the int check its validators share.

Torch-free. Every dataplane error derives from `EngineError`, so callers catch one base and
read `code` / `detail`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class EngineError(Exception):
    """Base of typed engine errors; `code` is stable and machine readable."""

    code: ClassVar[str] = "ENGINE_ERROR"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidSamplingParams(EngineError):
    code = "INVALID_SAMPLING_PARAMS"


class InvalidRequest(EngineError):
    code = "INVALID_REQUEST"


class ModelInUse(EngineError):
    """The model's projections already carry the LoRA tables of another live engine: a second
    engine on the same model object would detach them and leave the first one serving its
    eager steps without its adapters."""

    code = "MODEL_IN_USE"


class InvalidBatchPlan(EngineError):
    """The plan's row/request/sample coordinates violate an invariant (a bug, caught pre-launch)."""

    code = "INVALID_BATCH_PLAN"


def is_int(value: object) -> bool:
    """True for a real int; bool is rejected (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)
