"""Engine: scheduler (torch-free), model runner and the public `Engine` API.

The scheduler is imported eagerly (no torch); the model runner and `Engine` load lazily so
that `import dataplane.engine` stays cheap and torch-free for scheduler-only users.
"""

from __future__ import annotations

import importlib
from typing import Any

from dataplane.engine.scheduler import (
    ScheduleOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    StepUpdate,
)

__all__ = [
    "Engine",
    "ScheduleOutput",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepUpdate",
]

_LAZY = {"Engine": "dataplane.engine.engine"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dataplane.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
