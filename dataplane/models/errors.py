"""Typed errors of model loading. Codes are stable; bad input changes nothing."""

from __future__ import annotations

from dataplane.core import EngineError


class ModelLoadError(EngineError):
    """The model directory is missing files, or a tensor has the wrong name/shape/dtype."""

    code = "MODEL_LOAD_ERROR"


class UnsupportedModel(EngineError):
    """The config names an architecture or option this engine does not implement."""

    code = "UNSUPPORTED_MODEL"
