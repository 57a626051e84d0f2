"""The agent's HTTP front process: terminates client connections (uvicorn) and relays
each request's ASGI messages to the engine process over the bridge socket
(agent/http_bridge.py explains why; agent/bridge_frames.py the frames), and renders
streamed answers' SSE chunks from the engine's token records (agent/sse_chunks.py).

Started by the agent daemon (`python -m agent.http_frontend --socket PATH --host H --port
P --grace S`); it imports no engine code and holds no state of its own. SIGTERM drains it
the way it drains uvicorn: no new connections, requests in flight finish (at most
`--grace` seconds). When the engine process goes away (its end of the socket closes), the
front exits at once: nothing could answer its requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from agent import bridge_frames as bf
from agent.sse_chunks import ChunkWriter

log = logging.getLogger("adapterplane.agent.http_frontend")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
EXIT_ENGINE_GONE = 3
"""Exit status when the engine process's end of the bridge closed under the front."""
CONNECT_TIMEOUT_S = 30.0


def _body(data: bytes, more: bool) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


class _Link(asyncio.Protocol):
    """The bridge connection: frames in, to each request's queue."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.frames = bf.FrameReader()

    def data_received(self, data: bytes) -> None:
        queues = self.relay.queues
        for sid, kind, payload in self.frames.feed(data):
            if kind == bf.TOKENS:  # records of many streams, each led by its stream id
                for record in json.loads(payload):
                    queue = queues.get(record[0])
                    if queue is not None:
                        queue.put_nowait((kind, record))
                continue
            queue = queues.get(sid)
            if queue is not None:
                queue.put_nowait((kind, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.relay.closing:
            return
        log.error("the engine process closed the bridge; the HTTP front exits")
        logging.shutdown()
        os._exit(EXIT_ENGINE_GONE)


class Relay:
    """The front's ASGI app: each HTTP request becomes a bridge stream."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.queues: dict[int, asyncio.Queue[tuple[int, Any]]] = {}
        """Stream id -> its frames (kind, payload bytes; a TOKENS record: its list)."""
        self.transport: asyncio.Transport | None = None
        self.closing = False
        self._next = 0

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while True:
            try:
                transport, _ = await loop.create_unix_connection(lambda: _Link(self),
                                                                 self.socket_path)
            except OSError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            self.transport = transport
            return

    def _write(self, sid: int, kind: int, payload: bytes = b"") -> None:
        assert self.transport is not None
        self.transport.write(bf.frame(sid, kind, payload))

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # no websockets
            return
        self._next += 1
        sid = self._next
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.queues[sid] = queue
        self._write(sid, bf.REQUEST, bf.encode_scope(scope))
        pump: asyncio.Task[None] | None = None
        complete = False
        writer: ChunkWriter | None = None
        try:
            while not complete:
                frames = [await queue.get()]
                while not queue.empty():  # what else arrived: token records go out as one
                    frames.append(queue.get_nowait())
                rendered: list[bytes] = []
                for kind, payload in frames:
                    if kind == bf.TOKENS and writer is not None:
                        rendered.append(writer.tokens(payload[1:]))
                        continue
                    if rendered:
                        await send(_body(b"".join(rendered), True))
                        rendered = []
                    if kind == bf.RECEIVE:  # in order: each answer after the one before
                        pump = asyncio.create_task(self._answer(sid, receive, pump))
                    elif kind == bf.DISCONNECT:  # the client went away (the engine knows)
                        complete = True
                        break
                    elif kind == bf.START:
                        await send(bf.decode_start(payload))
                    elif kind == bf.STREAM_OPEN:
                        writer = ChunkWriter(json.loads(payload))
                    elif kind == bf.STREAM_END and writer is not None:
                        await send(_body(writer.end(json.loads(payload)), False))
                        complete = True
                        break
                    elif kind in (bf.CHUNK_MORE, bf.CHUNK_END):
                        await send(_body(payload, kind == bf.CHUNK_MORE))
                        if kind == bf.CHUNK_END:
                            complete = True
                            break
                if rendered:
                    await send(_body(b"".join(rendered), True))
        finally:
            self.queues.pop(sid, None)
            if pump is not None:
                pump.cancel()
            if not complete:  # cancelled (the server stops): the engine stops too
                self._write(sid, bf.DISCONNECT)

    async def _answer(self, sid: int, receive: Receive,
                      before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await asyncio.wait([before])
        message = await receive()
        if message["type"] == "http.request":
            more = bool(message.get("more_body", False))
            self._write(sid, bf.BODY_MORE if more else bf.BODY_END, bytes(message.get("body", b"")))
        else:
            self._write(sid, bf.DISCONNECT)
            queue = self.queues.get(sid)
            if queue is not None:  # and this request's relay ends
                queue.put_nowait((bf.DISCONNECT, b""))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.connect()
                except OSError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.closing = True
                await send({"type": "lifespan.shutdown.complete"})
                return


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m agent.http_frontend")
    p.add_argument("--socket", required=True, help="the engine process's bridge socket")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--grace", type=int, required=True,
                   help="seconds requests in flight get to finish after SIGTERM")
    args = p.parse_args(argv)
    config = uvicorn.Config(Relay(args.socket), host=args.host, port=args.port,
                            log_level="info", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=args.grace)
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
