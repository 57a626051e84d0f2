"""Incremental detokenisation for streaming (the TGI / vLLM "prefix offset" method).

Decoding token by token is wrong for byte-level BPE (a UTF-8 character split across tokens)
and for SentencePiece (a token's leading space depends on its neighbours). So each push
decodes a short window that starts a few tokens back and emits what its text adds to the
window's text at the last emit, once it no longer ends in an incomplete character
(U+FFFD). The window starts inside the prompt so the first output token decodes in context.
Invariant: the concatenation of all pushes plus `flush()` equals
decode(prompt + output)[len(decode(prompt)):] (for byte-level tokenizers: decode(output)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

INITIAL_CONTEXT = 5
"""Prompt tokens kept as decoding context for the first generated token, and the context
kept whenever the window restarts."""

MAX_WINDOW = 12
"""Tokens the decoded window may span before it restarts `INITIAL_CONTEXT` tokens back."""


class IncrementalDetokenizer:
    """The window ``ids[prefix_offset:]`` is decoded once per push; its text as of the last
    emit (``prefix_text``, the decode of ``ids[prefix_offset:read_offset]``) is kept, so the
    new text is what the decode adds to it. The window start stays put, giving later tokens
    more context rather than re-decoding a shifted prefix each push; once the window spans
    `MAX_WINDOW` tokens it restarts near the end (one extra decode then)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int]) -> None:
        """`decode(ids) -> str` already applies the skip-special-tokens policy."""
        self._decode = decode
        self._ids: list[int] = list(prompt_ids)
        self._read_offset = len(self._ids)
        self._restart(max(self._read_offset - INITIAL_CONTEXT, 0))

    def _restart(self, prefix_offset: int) -> None:
        self._prefix_offset = prefix_offset
        self._prefix_text = (self._decode(self._ids[prefix_offset:self._read_offset])
                             if prefix_offset < self._read_offset else "")

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final (possibly "")."""
        self._ids.append(token_id)
        text = self._decode(self._ids[self._prefix_offset:])
        prefix = self._prefix_text
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self._read_offset = len(self._ids)
        self._prefix_text = text
        if self._read_offset - self._prefix_offset > MAX_WINDOW:
            self._restart(self._read_offset - INITIAL_CONTEXT)
        return text[len(prefix):]

    def flush(self) -> str:
        """Text still held back (e.g. a trailing incomplete character); call once at the end."""
        text = self._decode(self._ids[self._prefix_offset:])
        prefix = self._prefix_text
        self._read_offset = len(self._ids)
        self._restart(self._read_offset)
        return text[len(prefix):] if len(text) > len(prefix) else ""
