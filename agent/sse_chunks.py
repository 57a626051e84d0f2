"""Streamed OpenAI answers as server-sent events, rendered from token records.

The HTTP front process renders every streamed answer's chunks (agent/http_frontend.py):
the engine process describes a stream once (its chunk head and whether it is a chat) and
then sends each sample's new tokens as a record; the front turns records into the
`data: {...}` events OpenAI clients read. The per-token JSON work then runs on the
front's interpreter, not under the engine's lock.

A record: `[choice index, text, token ids, finish reason or None, logprobs or None]`
(logprobs already in OpenAI's shape for the choice's kind). The end of a stream: usage
(when asked), then `[DONE]`; or one error event, after which nothing follows. Imports
only the standard library (the front stays light).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

DONE = b"data: [DONE]\n\n"

Record = Sequence[Any]


class ChunkWriter:
    """One streamed answer: its records as SSE events (a chat choice's first chunk
    carries the assistant role)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.chat = bool(spec["chat"])
        self._head = json.dumps(spec["head"]).encode()[:-1]
        """The encoded head less its closing brace (every chunk starts with it)."""
        self._started: set[int] = set()

    def _event(self, tail: dict[str, Any]) -> bytes:
        return b"data: " + self._head + b"," + json.dumps(tail).encode()[1:] + b"\n\n"

    def tokens(self, record: Record) -> bytes:
        index, text, ids, finish, logprobs = record
        if not self.chat:
            return self._event({"choices": [{"index": index, "text": text,
                                             "finish_reason": finish, "logprobs": logprobs,
                                             "token_ids": ids}]})
        delta: dict[str, Any] = {"content": text}
        if index not in self._started:
            self._started.add(index)
            delta["role"] = "assistant"
        return self._event({"choices": [{"index": index, "delta": delta,
                                         "finish_reason": finish, "logprobs": logprobs,
                                         "token_ids": ids}]})

    def end(self, final: Mapping[str, Any]) -> bytes:
        """The stream's last events: `{"error": body}` alone, or usage (when given) and
        [DONE]."""
        if "error" in final:
            return b"data: " + json.dumps(final["error"]).encode() + b"\n\n"
        usage = final.get("usage")
        return (b"" if usage is None else self._event({"choices": [], "usage": usage})) + DONE
