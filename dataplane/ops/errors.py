"""Typed errors of the fused ops (stable codes). Raised before any kernel launch."""

from __future__ import annotations

from dataplane.core import EngineError


class OpsError(EngineError):
    """Bad shapes, strides, dtypes or an unknown backend for a fused op."""

    code = "OPS_INVALID"
