"""Engine: the builder, the public `Engine`, its scheduler (torch-free) and model runner.

Build every engine with `build_engine(EngineSpec(...))` (engine/builder.py). The scheduler
and `EngineConfig` are imported eagerly (no torch); the builder, `Engine` and the runner
load lazily so that `import dataplane.engine` stays cheap and torch-free for
scheduler-only users.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dataplane.engine.config import EngineConfig
from dataplane.engine.scheduler import (
    ScheduleOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    StepUpdate,
)

if TYPE_CHECKING:
    from dataplane.engine.builder import BaseModel, EngineSpec, build_engine, load_base
    from dataplane.engine.engine import Engine
    from dataplane.engine.observer import EngineObserver
    from dataplane.engine.request_output import RequestOutput

__all__ = [
    "BaseModel",
    "Engine",
    "EngineConfig",
    "EngineObserver",
    "EngineSpec",
    "RequestOutput",
    "ScheduleOutput",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepUpdate",
    "build_engine",
    "load_base",
]

_LAZY = {"Engine": "dataplane.engine.engine",
         "RequestOutput": "dataplane.engine.request_output",
         "EngineObserver": "dataplane.engine.observer",
         "BaseModel": "dataplane.engine.builder",
         "EngineSpec": "dataplane.engine.builder",
         "build_engine": "dataplane.engine.builder",
         "load_base": "dataplane.engine.builder"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dataplane.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
