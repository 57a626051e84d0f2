"""The one error root of the data plane (`EngineError`), the engine core's own errors and
the int check their validators share.

Torch-free, stdlib only. Rule: every exception class the data plane defines derives from
`EngineError` — directly, or through its package's base (`PoolError`, `LoraKernelError`,
`ParallelError`, `CollectionError`, `OpsError`, `ArtifactRejected`, `IdentityError`, ...) —
so a caller catches `EngineError` alone for "any data-plane refusal" and reads `code`,
`message` and `detail`. `tests/core/test_error_roots.py` enforces it. (Plain `ValueError` /
`TypeError` raised for a caller's programming mistake are not typed errors.)

`code` is stable, machine-readable API: a class attribute on most errors; per instance
where one class carries many codes (`ArtifactRejected.code` is a `RejectionCode`,
`IdentityError.code` a lowercase str). Packages whose codes predate the root keep their
spelling (lowercase in kernels, parallel, artifacts, identity) and their `str(exc)`:
`code_in_str` makes it read `"<code>: <message>"` there, the bare message elsewhere.
"""

from __future__ import annotations

from typing import Any, ClassVar


class EngineError(Exception):
    """Root of every typed data-plane error; `code` is stable and machine readable,
    `message` a human sentence, `detail` JSON-able context."""

    code: str = "ENGINE_ERROR"
    """Class-level default; a subclass overrides it (or sets it per instance)."""
    code_in_str: ClassVar[bool] = False
    """When true, `str(exc)` is `"<code>: <message>"` instead of `message`."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(f"{self.code}: {message}" if self.code_in_str else message)
        self.message = message
        self.detail: dict[str, Any] = detail


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
