"""Typed errors of the tensor-parallel data plane.

Every error carries a stable lowercase ``code`` and derives from
:class:`dataplane.errors.EngineError`; ``str(exc)`` is ``"<code>: <message>"``. Validation
happens before anything is written: a rejected shard, load or forward changes no table and
issues no collective.
"""

from __future__ import annotations

from dataplane.errors import EngineError


class ParallelError(EngineError):
    """Base class: invalid tensor-parallel input or state."""

    code = "parallel_error"
    code_in_str = True


class ProcessGroupError(ParallelError):
    """The process group is missing, misconfigured or of the wrong size."""

    code = "process_group_invalid"


class IndivisibleShardError(ParallelError):
    """A sharded axis (heads, width, vocab, rank) is not divisible by the TP degree."""

    code = "indivisible_shard"


class ShardShapeError(ParallelError):
    """A global factor or weight does not have the shape its module declares."""

    code = "shard_shape_mismatch"


class UnknownLayoutError(ParallelError):
    """A parallel style, or the shard layout an identity records, is not a known one."""

    code = "unknown_layout"
