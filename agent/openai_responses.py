"""OpenAI response bodies: full completions, streaming chunks, and the SSE generator.

Every body carries `adapterplane: {namespace, alias, generation, artifact_digest}` (null
for the base model) and each choice carries the `token_ids` it produced, so clients can
tell exactly what a response ran on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agent.catalog import ServingError
from agent.openai_errors import error_body
from agent.serving import EngineLoop, Event
from dataplane.engine.engine import RequestOutput


@dataclass
class Answer:
    id: str
    kind: str
    model: str
    created: int
    binding: dict[str, Any] | None

    @property
    def is_chat(self) -> bool:
        return self.kind != "text_completion"

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "adapterplane": self.binding}

    @staticmethod
    def usage(out: RequestOutput) -> dict[str, Any]:
        """OpenAI's usage; `prompt_tokens_details.cached_tokens`: prompt tokens served from
        the prefix cache (for an activated LoRA, also a base prefix other requests left)."""
        p, c = len(out.prompt_token_ids), len(out.token_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens}}

    def full(self, out: RequestOutput) -> dict[str, Any]:
        if self.is_chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": out.text},
                                      "finish_reason": out.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason,
                      "logprobs": None}
        choice["token_ids"] = list(out.token_ids)
        return {**self.head(self.kind), "choices": [choice], "usage": self.usage(out)}

    def chunk(self, out: RequestOutput, first: bool) -> dict[str, Any]:
        finish = out.finish_reason if out.finished else None
        if self.is_chat:
            delta: dict[str, Any] = {"content": out.new_text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": out.new_text, "finish_reason": finish,
                      "logprobs": None}
            obj = "text_completion"
        choice["token_ids"] = list(out.new_token_ids)
        return {**self.head(obj), "choices": [choice]}


async def stream_events(loop: EngineLoop, answer: Answer, first: RequestOutput,
                        events: asyncio.Queue[Event], include_usage: bool
                        ) -> AsyncIterator[dict[str, str]]:
    """SSE events of one request: a chunk per engine output, optional usage, [DONE].
    A client that goes away aborts the request in the engine."""
    out = first
    finished = False
    try:
        is_first = True
        while True:
            yield {"data": json.dumps(answer.chunk(out, is_first))}
            is_first = False
            if out.finished:
                finished = True
                break
            nxt = await events.get()
            if isinstance(nxt, ServingError):
                finished = True
                yield {"data": json.dumps(error_body(nxt.status, nxt.code, nxt.message,
                                                     detail=nxt.detail), default=str)}
                return
            out = nxt
        if include_usage:
            obj = "chat.completion.chunk" if answer.is_chat else "text_completion"
            yield {"data": json.dumps({**answer.head(obj), "choices": [],
                                       "usage": Answer.usage(out)})}
        yield {"data": "[DONE]"}
    finally:
        if not finished:
            loop.abort(answer.id)
