"""A streamed OpenAI answer on the engine side: each sample's engine outputs become token
records (agent/sse_chunks.py) that the HTTP front process renders as SSE chunks.

Per token, the engine process does one small list per sample output (its choice index,
new text and ids, finish reason, and logprobs when asked); the records of one event-loop
iteration leave as one bridge frame (agent/http_bridge.py). No coroutine wakes per token
and no JSON is built per token here: the chunks' encoding is the front's work, on its
own interpreter.

Events reach an :class:`Inbox` (the mailbox delivers them on the event loop): its queue
until the answer's first tokens decided the HTTP status, then the :class:`TokenStream`
straight away. A client that goes away, a failed sample or the end of the stream aborts
every sample still generating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agent.catalog import ServingError
from agent.http_bridge import TOKEN_PIPE, TokenPipe
from agent.openai_choices import Child
from agent.openai_errors import error_body
from agent.openai_responses import Answer
from agent.serving import EngineLoop, Event
from dataplane.engine.engine import RequestOutput

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Streamed answers are never cached, and proxies must not buffer them."""


class Inbox:
    """One API request's sample events, `(sample k, event)`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.stream: TokenStream | None = None

    def put_nowait(self, item: tuple[int, Event]) -> None:
        if self.stream is not None:
            self.stream.put(item)
        else:
            self.queue.put_nowait(item)


class TokenStream(Response):
    """The answer of a streaming request whose samples all started (`started`: the
    events received so far)."""

    def __init__(self, loop: EngineLoop, answer: Answer, kids: Sequence[Child], n: int,
                 started: Sequence[tuple[int, Event]], inbox: Inbox,
                 include_usage: bool) -> None:
        self.status_code = 200
        self.media_type = "text/event-stream"
        self.background = None
        self.init_headers(SSE_HEADERS)
        self.engine_loop = loop
        self.answer = answer
        self.kids = kids
        self.n = n
        self.started = list(started)
        self.inbox = inbox
        self.include_usage = include_usage
        self.finals: dict[int, RequestOutput] = {}
        self.seen: set[int] = set()
        self.done: asyncio.Future[None] | None = None
        self.pipe: TokenPipe | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pipe = scope.get("extensions", {}).get(TOKEN_PIPE)
        try:
            if pipe is None:
                raise RuntimeError("streamed answers are served through the agent's HTTP "
                                   "front process (agent/http_bridge.py)")
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            self.done = asyncio.get_running_loop().create_future()
            self.pipe = pipe
            obj = "chat.completion.chunk" if self.answer.is_chat else "text_completion"
            pipe.open({"head": self.answer.head(obj), "chat": self.answer.is_chat})
            for item in self.started:
                self.put(item)
            while not self.inbox.queue.empty():
                self.put(self.inbox.queue.get_nowait())
            self.inbox.stream = self
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                await asyncio.wait([self.done, gone], return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
        finally:  # a failed sample, or a client gone: no sample keeps generating
            for k, kid in enumerate(self.kids):
                if k not in self.finals:
                    self.engine_loop.abort(kid.request_id)

    def put(self, item: tuple[int, Event]) -> None:
        """One sample event, on the event loop: its record to the front."""
        pipe, done = self.pipe, self.done
        if pipe is None or done is None or done.done():
            return
        k, event = item
        if isinstance(event, ServingError):
            pipe.end({"error": error_body(event.status, event.code, event.message,
                                          detail=event.detail)})
            done.set_result(None)
            return
        kid, answer = self.kids[k], self.answer
        if answer.echo is not None and kid.sample == 0:
            answer.echo.learn(kid.prompt_index, event)
        pipe.tokens(answer.record(kid.prompt_index * self.n + kid.sample, event,
                                  k not in self.seen, kid.prompt_index))
        self.seen.add(k)
        if not event.finished:
            return
        self.finals[k] = event
        if len(self.finals) < len(self.kids):
            return
        final: dict[str, Any] = {}
        if self.include_usage:
            firsts = [self.finals[j] for j, c in enumerate(self.kids) if c.sample == 0]
            echo = answer.echo
            generated = () if echo is not None and echo.drop_completion else list(
                self.finals.values())
            final["usage"] = Answer.usage(firsts, generated)
        pipe.end(final)
        done.set_result(None)


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone away (the request body is already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
