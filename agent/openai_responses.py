"""OpenAI response bodies: full completions, and a streamed sample's token records
(agent/openai_stream.py streams them; the front renders them, agent/sse_chunks.py).

Every body carries `adapterplane: {namespace, alias, generation, artifact_digest}` (null
for the base model) and each choice carries the `token_ids` it produced, so clients can
tell exactly what a response ran on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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

    def record(self, index: int, out: RequestOutput, first: bool,
               prompt_index: int = 0) -> list[Any]:
        """A sample's new tokens as a token record for the front's chunk renderer
        (agent/sse_chunks.py): choice index, text, token ids, finish reason, logprobs."""
        finish = out.finish_reason if out.finished else None
        new = None if out.logprobs is None else out.logprobs[
            len(out.logprobs) - len(out.new_token_ids):]
        if self.is_chat:
            return [index, out.new_text, out.new_token_ids, finish, self.logprobs(new)]
        text, ids, lps = self._completion(out.new_text, out.new_token_ids, new)
        head, prompt = self._echoed(prompt_index, out, first)
        return [index, head + text, ids, finish, self.logprobs(lps, prompt)]


def _by_text(top: Sequence[tuple[int, float]], text: Callable[[int], str]) -> dict[str, float]:
    """Completions' `top_logprobs` entry: text -> logprob, most likely first; of ids whose
    text is the same, the most likely one's value (OpenAI's format keys by text)."""
    out: dict[str, float] = {}
    for token_id, value in top:
        out.setdefault(text(token_id), value)
    return out
