"""The engine process's end of the HTTP bridge: runs the agent's ASGI app for requests
that the front process (agent/http_frontend.py) receives.

Why two processes: the engine thread and the code that answers HTTP share one
interpreter lock. Streaming costs one socket write per token per stream (the event
loop's write holds the lock through the system call) plus the HTTP protocol's Python;
at hundreds of streams that time is taken from the engine's steps. Here the app's ASGI
messages of one event-loop iteration leave as one write on one Unix socket, and the
front process does the per-connection work on its own interpreter.

ASGI semantics are kept end to end: the app's `receive()` asks the front for the next
request message (so a request body is read only when the app reads it, after
authentication), and a client that goes away is an `http.disconnect` the app sees as it
would under any ASGI server.

Streamed answers go further: the scope's `TOKEN_PIPE` extension lets the app hand a
stream's token records to the front, which renders the SSE chunks (agent/sse_chunks.py);
the records of one loop iteration, of every stream, leave as one TOKENS frame.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

from agent.bridge_frames import (
    BODY_END,
    BODY_MORE,
    CHUNK_END,
    CHUNK_MORE,
    DISCONNECT,
    RECEIVE,
    REQUEST,
    START,
    STREAM_END,
    STREAM_OPEN,
    TOKENS,
    FrameReader,
    decode_scope,
    encode_start,
    frame,
)

log = logging.getLogger("adapterplane.agent.http_bridge")

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]
DISCONNECTED: Message = {"type": "http.disconnect"}
_ERROR_BODY = b"Internal Server Error"
TOKEN_PIPE = "adapterplane.token_pipe"
"""The scope extension holding the request's :class:`TokenPipe`."""


class _Stream:
    __slots__ = ("disconnected", "inbox", "started", "task")

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.started = False
        self.disconnected = False
        self.task: asyncio.Task[None] | None = None


class TokenPipe:
    """One streamed answer's way to the front's chunk renderer: `open` (after the
    response start) with the stream's spec, a record per sample output, `end` once.

    The pipe writes beside the app's `send`, so the response start must have reached the
    bridge first: pure ASGI middleware only (a BaseHTTPMiddleware holds the start back
    and `open` refuses)."""

    __slots__ = ("_bridge", "_sid", "_stream")

    def __init__(self, bridge: BridgeProtocol, sid: int, stream: _Stream) -> None:
        self._bridge, self._sid, self._stream = bridge, sid, stream

    def open(self, spec: dict[str, Any]) -> None:
        if not self._stream.started:
            raise RuntimeError("a token stream opens after its response start was sent")
        self._bridge._write(self._sid, STREAM_OPEN, json.dumps(spec).encode())

    def tokens(self, record: list[Any]) -> None:
        if not self._stream.disconnected:
            self._bridge._record(self._sid, record)

    def end(self, final: dict[str, Any]) -> None:
        if not self._stream.disconnected:
            self._bridge._write(self._sid, STREAM_END,
                                json.dumps(final, default=str).encode())


class BridgeProtocol(asyncio.Protocol):
    """One front process's connection; a task per request runs `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.loop = asyncio.get_running_loop()
        self.frames = FrameReader()
        self.streams: dict[int, _Stream] = {}
        self.transport: asyncio.Transport | None = None
        self._out = bytearray()
        self._records: list[list[Any]] = []
        """Token records not yet framed (each led by its stream id)."""
        self._flush_due = False
        self._paused: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for sid, kind, payload in self.frames.feed(data):
            if kind == REQUEST:
                stream = self.streams[sid] = _Stream()
                stream.task = self.loop.create_task(self._run(sid, stream,
                                                              decode_scope(payload)))
                continue
            known = self.streams.get(sid)
            if known is None:  # the request already completed
                continue
            if kind in (BODY_MORE, BODY_END):
                known.inbox.put_nowait({"type": "http.request", "body": payload,
                                        "more_body": kind == BODY_MORE})
            elif kind == DISCONNECT:
                known.disconnected = True
                known.inbox.put_nowait(DISCONNECTED)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for stream in self.streams.values():
            stream.disconnected = True
            stream.inbox.put_nowait(DISCONNECTED)
        if self._paused is not None:
            self._paused.set_result(None)
            self._paused = None

    def pause_writing(self) -> None:
        self._paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._paused is not None:
            self._paused.set_result(None)
            self._paused = None

    # ---- frames out: one write per event-loop iteration ----------------------------------
    def _write(self, sid: int, kind: int, payload: bytes = b"") -> None:
        self._frame_records()  # frames stay in the order they were written
        self._out += frame(sid, kind, payload)
        self._schedule()

    def _record(self, sid: int, record: list[Any]) -> None:
        self._records.append([sid, *record])
        self._schedule()

    def _frame_records(self) -> None:
        if self._records:
            self._out += frame(0, TOKENS, json.dumps(self._records).encode())
            self._records = []

    def _schedule(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        self._frame_records()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes(self._out))
        self._out.clear()

    # ---- one request -----------------------------------------------------------------------
    async def _run(self, sid: int, stream: _Stream, scope: Message) -> None:
        async def receive() -> Message:
            if not stream.inbox.empty():
                return stream.inbox.get_nowait()
            if stream.disconnected:
                return DISCONNECTED
            self._write(sid, RECEIVE)
            return await stream.inbox.get()

        async def send(message: Message) -> None:
            if stream.disconnected:
                return
            kind = message["type"]
            if kind == "http.response.start":
                stream.started = True
                self._write(sid, START, encode_start(message))
            elif kind == "http.response.body":
                more = bool(message.get("more_body", False))
                self._write(sid, CHUNK_MORE if more else CHUNK_END,
                            bytes(message.get("body", b"")))
            if self._paused is not None:
                await asyncio.shield(self._paused)

        scope["extensions"] = {TOKEN_PIPE: TokenPipe(self, sid, stream)}
        try:
            await self.app(scope, receive, send)
        except Exception:  # an ASGI server answers the app's failure, as uvicorn does
            log.exception("request %s %s failed", scope["method"], scope["path"])
            if not stream.started:
                self._write(sid, START, encode_start({"status": 500, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8")]}))
                self._write(sid, CHUNK_END, _ERROR_BODY)
            else:
                self._write(sid, CHUNK_END)
        finally:
            self.streams.pop(sid, None)

    async def drain(self) -> None:
        """Wait for the requests in flight (their tasks)."""
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        if tasks:
            await asyncio.wait(tasks)


async def serve_bridge(app: ASGIApp, path: str) -> asyncio.Server:
    """Listen on the Unix socket `path` for the front process (owner-only permissions:
    the socket's directory is private to the agent)."""
    return await asyncio.get_running_loop().create_unix_server(
        lambda: BridgeProtocol(app), path)
