"""Activated LoRA (aLoRA): where in a request its adapter switches on.

An aLoRA adapter carries invocation token ids (PEFT's `alora_invocation_tokens`). For a
request on it, the activation offset is the start of the LAST exact occurrence of that
sequence in the request's prompt token ids — the rule PEFT applies to the input ids it
generates from. Rows before the offset run as the base model in every adapted projection
(their `BatchPlan.row_slot` is -1: the LoRA kernels skip them as base rows, no extra
launch); the first invocation token and every row after it, generated tokens included,
run with the adapter. Because pre-activation rows are base rows, their K/V equals the base
model's, and the prefix cache keys the blocks wholly before the offset by the base
identity (kvcache/prefix_key.py): one cached base prefix serves the base model and every
aLoRA of that base.

A prompt without the invocation sequence is refused (ALORA_NOT_INVOKED) unless the caller
asks for base behaviour, in which case the request is served as a base request.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataplane.errors import InvalidRequest

ALWAYS_ON = 0
"""The activation offset of a plain LoRA (and of base requests): every row."""


class AloraNotInvoked(InvalidRequest):
    """An aLoRA request whose prompt does not contain the adapter's invocation tokens."""

    code = "ALORA_NOT_INVOKED"


def activation_offset(token_ids: Sequence[int], invocation: Sequence[int]) -> int | None:
    """Start of the last exact occurrence of `invocation` in `token_ids`, or None."""
    n = len(invocation)
    if n == 0:
        raise ValueError("an invocation sequence has at least one token")
    first, tail = invocation[0], list(invocation)
    for start in range(len(token_ids) - n, -1, -1):
        if token_ids[start] == first and list(token_ids[start:start + n]) == tail:
            return start
    return None
