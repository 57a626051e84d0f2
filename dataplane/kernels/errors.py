"""Typed errors of the LoRA kernel layer.

Every error carries a stable lowercase ``code`` so callers (engine, agent) can map it to
a response without parsing messages, and derives from
:class:`dataplane.errors.EngineError`; ``str(exc)`` is ``"<code>: <message>"``.
Validation happens before any launch or write: a rejected call changes nothing.
"""

from __future__ import annotations

from dataplane.errors import EngineError


class LoraKernelError(EngineError):
    """Base class: invalid input to a LoRA kernel entry point."""

    code = "lora_kernel_error"
    code_in_str = True


class LoraShapeError(LoraKernelError):
    """A tensor's shape, dtype, device or stride does not match the contract."""

    code = "lora_shape_mismatch"


class LoraRankError(LoraKernelError):
    """A rank is negative or larger than the table's physical rank."""

    code = "lora_rank_exceeds_table"


class LoraSlotError(LoraKernelError):
    """A slot index is outside ``[0, num_slots)`` (or ``-1`` where allowed)."""

    code = "lora_slot_out_of_range"


class LoraBackendUnavailable(LoraKernelError):
    """The requested backend cannot run on this device/installation."""

    code = "lora_backend_unavailable"
