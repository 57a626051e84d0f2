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
"""

from __future__ import annotations

import asyncio
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


class _Stream:
    __slots__ = ("disconnected", "inbox", "started", "task")

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.started = False
        self.disconnected = False
        self.task: asyncio.Task[None] | None = None


class BridgeProtocol(asyncio.Protocol):
    """One front process's connection; a task per request runs `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.loop = asyncio.get_running_loop()
        self.frames = FrameReader()
        self.streams: dict[int, _Stream] = {}
        self.transport: asyncio.Transport | None = None
        self._out = bytearray()
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
        self._out += frame(sid, kind, payload)
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
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
