"""OpenAI response bodies: full completions, streaming chunks, and the SSE generator.

Every body carries `adapterplane: {namespace, alias, generation, artifact_digest}` (null
for the base model) and each choice carries the `token_ids` it produced, so clients can
tell exactly what a response ran on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.catalog import ServingError
from agent.openai_choices import Child
from agent.openai_errors import error_body
from agent.serving import EngineLoop, Event
from dataplane.engine.engine import RequestOutput
from dataplane.engine.request_output import TokenLogprobs


@dataclass
class Echo:
    """Completions' `echo`: each prompt's text before its choices' text, and with logprobs
    its tokens' prompt logprobs (first token: null), from each prompt's first sample."""

    texts: list[str]
    """By prompt index."""
    drop_completion: bool = False
    """max_tokens 0: the one generated token is left out (the prompt is only scored)."""
    scores: dict[int, tuple[TokenLogprobs, ...]] = field(default_factory=dict)
    """Prompt index -> its prompt logprobs, once its first sample reported them."""

    def learn(self, prompt_index: int, out: RequestOutput) -> None:
        if out.prompt_logprobs is not None and prompt_index not in self.scores:
            self.scores[prompt_index] = out.prompt_logprobs


@dataclass
class Answer:
    id: str
    kind: str
    model: str
    created: int
    binding: dict[str, Any] | None
    token_text: Callable[[int], str] = str
    """A token id's text (the tokenizer's decoding of it alone) for logprobs entries."""
    show_logprobs: bool = True
    """False: the request asked for none (samples ranked by best_of compute them anyway)."""
    echo: Echo | None = None
    _heads: dict[str, bytes] = field(default_factory=dict, repr=False)
    """`object` -> the encoded head less its closing brace (chunks of a stream share it)."""

    def logprobs(self, lps: Sequence[TokenLogprobs] | None,
                 prompt: tuple[Sequence[int], Sequence[TokenLogprobs]] | None = None
                 ) -> dict[str, Any] | None:
        """OpenAI's logprobs of generated tokens: completions' `tokens` / `token_logprobs`
        / `top_logprobs` / `text_offset` (offsets into the choice's text), chat's
        `content` entries with their UTF-8 `bytes`. None when the request asked for none.
        `prompt` (echo): the prompt's token ids and their scores go first."""
        if lps is None or not self.show_logprobs:
            return None
        text = self.token_text
        if self.is_chat:
            def entry(token_id: int, logprob: float) -> dict[str, Any]:
                t = text(token_id)
                return {"token": t, "logprob": logprob, "bytes": list(t.encode())}
            return {"content": [{**entry(lp.token_id, lp.logprob),
                                 "top_logprobs": [entry(i, v) for i, v in lp.top]}
                                for lp in lps]}
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if prompt is not None:
            ids, scores = prompt
            tokens += [text(t) for t in ids]
            values += [None, *(sc.logprob for sc in scores)]
            tops += [None, *(_by_text(sc.top, text) for sc in scores)]
        tokens += [text(lp.token_id) for lp in lps]
        values += [lp.logprob for lp in lps]
        tops += [_by_text(lp.top, text) for lp in lps]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}

    @property
    def is_chat(self) -> bool:
        return self.kind != "text_completion"

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "adapterplane": self.binding}

    @staticmethod
    def usage(prompts: Sequence[RequestOutput], samples: Sequence[RequestOutput]
              ) -> dict[str, Any]:
        """OpenAI's usage: each prompt counted once (`prompts`: its first sample), every
        generated sample's tokens; `prompt_tokens_details.cached_tokens`: prompt tokens
        served from the prefix cache (for an activated LoRA, also a base prefix other
        requests left)."""
        p = sum(len(out.prompt_token_ids) for out in prompts)
        c = sum(len(out.token_ids) for out in samples)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {
                    "cached_tokens": sum(out.num_cached_tokens for out in prompts)}}

    def choice(self, index: int, out: RequestOutput, prompt_index: int = 0) -> dict[str, Any]:
        """A finished sample as choice `index` of a full response."""
        if self.is_chat:
            choice: dict[str, Any] = {"index": index, "message": {"role": "assistant",
                                                                  "content": out.text},
                                      "finish_reason": out.finish_reason,
                                      "logprobs": self.logprobs(out.logprobs)}
            choice["token_ids"] = list(out.token_ids)
            return choice
        text, ids, lps = self._completion(out.text, out.token_ids, out.logprobs)
        head, prompt = self._echoed(prompt_index, out, True)
        return {"index": index, "text": head + text, "finish_reason": out.finish_reason,
                "logprobs": self.logprobs(lps, prompt), "token_ids": list(ids)}

    def _completion(self, text: str, ids: Sequence[int],
                    lps: Sequence[TokenLogprobs] | None
                    ) -> tuple[str, Sequence[int], Sequence[TokenLogprobs] | None]:
        """The generated part a choice shows (none when echo only scores the prompt)."""
        if self.echo is not None and self.echo.drop_completion:
            return "", (), None if lps is None else ()
        return text, ids, lps

    def _echoed(self, prompt_index: int, out: RequestOutput, first: bool
                ) -> tuple[str, tuple[Sequence[int], Sequence[TokenLogprobs]] | None]:
        """(echoed prompt text, (prompt ids, scores) for logprobs) of a choice's first
        chunk or full body; ("", None) without echo."""
        if self.echo is None or not first:
            return "", None
        self.echo.learn(prompt_index, out)
        return (self.echo.texts[prompt_index],
                (out.prompt_token_ids, self.echo.scores.get(prompt_index, ())))

    def full(self, choices: Sequence[tuple[int, int, RequestOutput]],
             usage: dict[str, Any]) -> dict[str, Any]:
        """choices: (index, prompt index, finished sample)."""
        return {**self.head(self.kind),
                "choices": [self.choice(i, out, p) for i, p, out in choices], "usage": usage}

    def sse_chunk(self, obj: str, choices: Sequence[dict[str, Any]],
                  usage: dict[str, Any] | None = None) -> bytes:
        """One streamed chunk as a server-sent event: the head (encoded once per stream),
        `choices`, and `usage` when given."""
        head = self._heads.get(obj)
        if head is None:
            head = self._heads[obj] = json.dumps(self.head(obj)).encode()[:-1]
        tail = {"choices": choices} if usage is None else {"choices": choices, "usage": usage}
        return b"data: " + head + b"," + json.dumps(tail).encode()[1:] + b"\n\n"

    def chunk(self, index: int, out: RequestOutput, first: bool,
              prompt_index: int = 0) -> bytes:
        """A sample's new tokens as one streamed chunk (`sse_chunk`)."""
        finish = out.finish_reason if out.finished else None
        new = None if out.logprobs is None else out.logprobs[
            len(out.logprobs) - len(out.new_token_ids):]
        if not self.is_chat:
            text, ids, lps = self._completion(out.new_text, out.new_token_ids, new)
            head, prompt = self._echoed(prompt_index, out, first)
            return self.sse_chunk("text_completion", [{
                "index": index, "text": head + text, "finish_reason": finish,
                "logprobs": self.logprobs(lps, prompt), "token_ids": list(ids)}])
        delta: dict[str, Any] = {"content": out.new_text}
        if first:
            delta["role"] = "assistant"
        return self.sse_chunk("chat.completion.chunk", [{
            "index": index, "delta": delta, "finish_reason": finish,
            "logprobs": self.logprobs(new), "token_ids": list(out.new_token_ids)}])


def _by_text(top: Sequence[tuple[int, float]], text: Callable[[int], str]) -> dict[str, float]:
    """Completions' `top_logprobs` entry: text -> logprob, most likely first; of ids whose
    text is the same, the most likely one's value (OpenAI's format keys by text)."""
    out: dict[str, float] = {}
    for token_id, value in top:
        out.setdefault(text(token_id), value)
    return out


def sse(data: str) -> bytes:
    """One server-sent event carrying `data` (a JSON document or `[DONE]`)."""
    return b"data: " + data.encode() + b"\n\n"


def coalesce(first: RequestOutput, later: RequestOutput) -> RequestOutput:
    """`later` reporting the new tokens of both outputs of one sample (consecutive)."""
    return replace(later, new_token_ids=first.new_token_ids + later.new_token_ids,
                   new_text=first.new_text + later.new_text)


async def stream_events(loop: EngineLoop, answer: Answer, kids: Sequence[Child],
                        n: int, started: Sequence[tuple[int, Event]],
                        events: asyncio.Queue[tuple[int, Event]], include_usage: bool
                        ) -> AsyncIterator[bytes]:
    """SSE events of one request's samples (`kids`, every one returned): a chunk per
    engine output with the sample's choice index, optional usage, [DONE]. `started` are
    the events already received. Outputs of one sample that arrived while the previous
    chunk was being sent go out as one chunk (a server behind its engine sends fewer,
    larger chunks instead of falling further behind). A client that goes away aborts
    every sample."""
    finals: dict[int, RequestOutput] = {}
    seen: set[int] = set()
    backlog = list(started)
    try:
        while len(finals) < len(kids):
            k, event = backlog.pop(0) if backlog else await events.get()
            if isinstance(event, ServingError):
                yield sse(json.dumps(error_body(event.status, event.code, event.message,
                                                detail=event.detail), default=str))
                return
            kid = kids[k]
            while not event.finished:  # take what else is here for this sample
                while not events.empty():
                    backlog.append(events.get_nowait())
                at = next((i for i, (j, _) in enumerate(backlog) if j == k), None)
                if at is None or not isinstance(later := backlog[at][1], RequestOutput):
                    break
                del backlog[at]
                if answer.echo is not None and kid.sample == 0:
                    answer.echo.learn(kid.prompt_index, event)
                event = coalesce(event, later)
            if answer.echo is not None and kid.sample == 0:
                answer.echo.learn(kid.prompt_index, event)
            yield answer.chunk(kid.prompt_index * n + kid.sample, event, k not in seen,
                               kid.prompt_index)
            seen.add(k)
            if event.finished:
                finals[k] = event
        if include_usage:
            obj = "chat.completion.chunk" if answer.is_chat else "text_completion"
            firsts = [finals[k] for k, kid in enumerate(kids) if kid.sample == 0]
            generated = () if answer.echo is not None and answer.echo.drop_completion else (
                list(finals.values()))
            yield answer.sse_chunk(obj, [], Answer.usage(firsts, generated))
        yield sse("[DONE]")
    finally:  # a failed sample, or a client gone: no sample keeps generating
        for k, kid in enumerate(kids):
            if k not in finals:
                loop.abort(kid.request_id)
