"""Incremental detokenisation for streaming (the TGI / vLLM "prefix offset" method).

Decoding token by token is wrong for byte-level BPE (a UTF-8 character split across tokens)
and for SentencePiece (a token's leading space depends on its neighbours). So each push
decodes a short window twice — from `prefix_offset` up to the previous token and up to the
new one — and emits the difference once it no longer ends in an incomplete character
(U+FFFD). The window starts inside the prompt so the first output token decodes in context.
Invariant: the concatenation of all pushes plus `flush()` equals
decode(prompt + output)[len(decode(prompt)):] (for byte-level tokenizers: decode(output)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

INITIAL_CONTEXT = 5
"""Prompt tokens kept as decoding context for the first generated token."""


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int]) -> None:
        """`decode(ids) -> str` already applies the skip-special-tokens policy."""
        self._decode = decode
        self._ids: list[int] = list(prompt_ids)
        self._prefix_offset = max(len(self._ids) - INITIAL_CONTEXT, 0)
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (possibly "")."""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        text = self._decode(self._ids[self._prefix_offset:])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return text[len(prefix):]
        return ""

    def flush(self) -> str:
        """Text still held back (e.g. a trailing incomplete character); call once at the end."""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        text = self._decode(self._ids[self._prefix_offset:])
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix):] if len(text) > len(prefix) else ""
