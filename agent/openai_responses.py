"""OpenAI response bodies: full completions, streaming chunks, and the SSE generator.

Every body carries `adapterplane: {namespace, alias, generation, artifact_digest}` (null
for the base model) and each choice carries the `token_ids` it produced, so clients can
tell exactly what a response ran on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.catalog import ServingError
from agent.openai_errors import error_body
from agent.serving import EngineLoop, Event
from dataplane.engine.engine import RequestOutput
from dataplane.engine.request_output import TokenLogprobs


@dataclass
class Answer:
    id: str
    kind: str
    model: str
    created: int
    binding: dict[str, Any] | None
    token_text: Callable[[int], str] = str
    """A token id's text (the tokenizer's decoding of it alone) for logprobs entries."""

    def logprobs(self, lps: Sequence[TokenLogprobs] | None) -> dict[str, Any] | None:
        """OpenAI's logprobs of generated tokens: completions' `tokens` / `token_logprobs`
        / `top_logprobs` / `text_offset` (offsets into the completion text), chat's
        `content` entries with their UTF-8 `bytes`. None when the request asked for none."""
        if lps is None:
            return None
        text = self.token_text
        if self.is_chat:
            def entry(token_id: int, logprob: float) -> dict[str, Any]:
                t = text(token_id)
                return {"token": t, "logprob": logprob, "bytes": list(t.encode())}
            return {"content": [{**entry(lp.token_id, lp.logprob),
                                 "top_logprobs": [entry(i, v) for i, v in lp.top]}
                                for lp in lps]}
        tokens = [text(lp.token_id) for lp in lps]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": [_by_text(lp.top, text) for lp in lps],
                "text_offset": offsets}

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
                                      "finish_reason": out.finish_reason,
                                      "logprobs": self.logprobs(out.logprobs)}
        else:
            choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason,
                      "logprobs": self.logprobs(out.logprobs)}
        choice["token_ids"] = list(out.token_ids)
        return {**self.head(self.kind), "choices": [choice], "usage": self.usage(out)}

    def chunk(self, out: RequestOutput, first: bool) -> dict[str, Any]:
        finish = out.finish_reason if out.finished else None
        new = None if out.logprobs is None else out.logprobs[
            len(out.logprobs) - len(out.new_token_ids):]
        if self.is_chat:
            delta: dict[str, Any] = {"content": out.new_text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                                      "logprobs": self.logprobs(new)}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": out.new_text, "finish_reason": finish,
                      "logprobs": self.logprobs(new)}
            obj = "text_completion"
        choice["token_ids"] = list(out.new_token_ids)
        return {**self.head(obj), "choices": [choice]}


def _by_text(top: Sequence[tuple[int, float]], text: Callable[[int], str]) -> dict[str, float]:
    """Completions' `top_logprobs` entry: text -> logprob, most likely first; of ids whose
    text is the same, the most likely one's value (OpenAI's format keys by text)."""
    out: dict[str, float] = {}
    for token_id, value in top:
        out.setdefault(text(token_id), value)
    return out


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
