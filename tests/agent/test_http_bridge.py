"""The HTTP bridge: a real front process (`python -m agent.http_frontend`, uvicorn) relays
real HTTP requests to an ASGI app served by `BridgeProtocol` on a Unix socket (as
`serve_bridge` serves it, the connections kept so a test can close them), and renders
the SSE chunks of streams the app hands it as token records (the expected events are
written out here in OpenAI's chunk format)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from agent.http_bridge import TOKEN_PIPE, BridgeProtocol
from agent.http_frontend import EXIT_ENGINE_GONE
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


class Gate:
    """Authentication before the body, as pure ASGI middleware (as the agent's)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (b"authorization", b"Bearer ok") not in scope["headers"]:
            await JSONResponse({"error": "unauthenticated"}, status_code=401)(
                scope, receive, send)
            return
        await self.app(scope, receive, send)


class Seen:
    def __init__(self) -> None:
        self.body_read = False
        self.stream_closed = threading.Event()
        self.release = threading.Event()


def make_app(seen: Seen) -> FastAPI:
    app = FastAPI()
    app.add_middleware(Gate)

    @app.get("/hello")
    async def hello(request: Request) -> Response:
        return JSONResponse({"path": request.url.path, "q": request.query_params.get("q")},
                            headers={"x-extra": "1"})

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        seen.body_read = True
        return Response(await request.body(), media_type="application/octet-stream")

    @app.get("/stream")
    async def stream(n: int = 3) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                for i in range(n):
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(0.01)
            finally:
                seen.stream_closed.set()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/forever")
    async def forever() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield b"data: first\n\n"
                while True:
                    await asyncio.sleep(0.02)
            finally:
                seen.stream_closed.set()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/slow")
    async def slow() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: begun\n\n"
            while not seen.release.is_set():
                await asyncio.sleep(0.02)
            yield b"data: done\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/boom")
    async def boom() -> Response:
        raise RuntimeError("the app failed")

    @app.get("/tokens")
    async def tokens(chat: bool = False, tag: str = "", end: str = "usage") -> Response:
        return TokenRecords(chat, tag, end)

    return app


def head(chat: bool) -> dict[str, Any]:
    return {"id": "x-1", "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 7, "model": "m", "adapterplane": {"alias": "a", "generation": 2}}


def batches(tag: str) -> list[list[list[Any]]]:
    """Token records by event-loop iteration (two choices; a batch's records share a
    frame): [index, text, token ids, finish reason, logprobs]."""
    return [[[0, f"{tag}hé", [5, 6], None, None], [1, f"{tag}b", [7], None, None]],
            [[0, " ✓", [8], None, {"content": [{"token": " ✓", "logprob": -0.5}]}]],
            [[1, "", [9], "length", None], [0, "!", [2], "stop", None]]]


USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


class TokenRecords(Response):
    """A stream handed to the front as token records (as agent/openai_stream.py does)."""

    def __init__(self, chat: bool, tag: str, end: str) -> None:
        self.chat, self.tag, self.end = chat, tag, end
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pipe = scope["extensions"][TOKEN_PIPE]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        pipe.open({"head": head(self.chat), "chat": self.chat})
        for batch in batches(self.tag):
            for record in batch:
                pipe.tokens(record)
            await asyncio.sleep(0.005)
        if self.end == "error":
            pipe.end({"error": {"error": {"message": "it failed", "code": "BOOM"}}})
        else:
            pipe.end({"usage": USAGE} if self.end == "usage" else {})


def expected_events(chat: bool, tag: str, end: str) -> list[Any]:
    """The SSE events a client must read, in OpenAI's chunk format."""
    events: list[Any] = []
    roles: set[int] = set()
    for batch in batches(tag):
        for index, text, ids, finish, logprobs in batch:
            if chat:
                delta: dict[str, Any] = {"content": text}
                if index not in roles:
                    roles.add(index)
                    delta["role"] = "assistant"
                choice = {"index": index, "delta": delta, "finish_reason": finish,
                          "logprobs": logprobs, "token_ids": ids}
            else:
                choice = {"index": index, "text": text, "finish_reason": finish,
                          "logprobs": logprobs, "token_ids": ids}
            events.append({**head(chat), "choices": [choice]})
    if end == "error":
        return [*events, {"error": {"message": "it failed", "code": "BOOM"}}]
    if end == "usage":
        events.append({**head(chat), "choices": [], "usage": USAGE})
    return [*events, "[DONE]"]


def read_events(text: str) -> list[Any]:
    assert text.endswith("\n\n")
    out: list[Any] = []
    for event in text.split("\n\n")[:-1]:
        assert event.startswith("data: ")
        data = event[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


class Bridge:
    """The bridge served on a thread's event loop, plus the front process."""

    def __init__(self, seen: Seen) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "http.sock")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.protocols: list[BridgeProtocol] = []
        app = make_app(seen)

        async def listen() -> asyncio.Server:  # serve_bridge's server, its connections kept
            def made() -> BridgeProtocol:
                self.protocols.append(BridgeProtocol(app))
                return self.protocols[-1]
            return await asyncio.get_running_loop().create_unix_server(made, self.path)
        self.server = asyncio.run_coroutine_threadsafe(listen(), self.loop).result(10)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.front = subprocess.Popen(
            [sys.executable, "-m", "agent.http_frontend", "--socket", self.path,
             "--host", "127.0.0.1", "--port", str(self.port), "--grace", "5"], cwd=REPO)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/hello", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or self.front.poll() is not None:
                    raise
                time.sleep(0.05)

    def close_engine_end(self) -> None:
        async def close() -> None:
            self.server.close()
            for protocol in self.protocols:
                if protocol.transport is not None:
                    protocol.transport.close()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)

    def stop(self) -> None:
        if self.front.poll() is None:
            self.front.kill()
            self.front.wait(10)
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.dir.cleanup()


@pytest.fixture()
def seen() -> Seen:
    return Seen()


@pytest.fixture()
def bridge(seen: Seen) -> Iterator[Bridge]:
    b = Bridge(seen)
    try:
        yield b
    finally:
        b.stop()


AUTH = {"authorization": "Bearer ok"}


def test_requests_and_responses_cross_the_bridge(bridge: Bridge, seen: Seen) -> None:
    r = httpx.get(bridge.url + "/hello?q=x%20y", headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"path": "/hello", "q": "x y"}
    assert r.headers["x-extra"] == "1"
    body = os.urandom(300_000)
    r = httpx.post(bridge.url + "/echo", content=body, headers=AUTH)
    assert r.status_code == 200 and r.content == body


def test_a_refused_request_is_answered_without_its_body_being_read(
        bridge: Bridge, seen: Seen) -> None:
    r = httpx.post(bridge.url + "/echo", content=b"x" * 100_000)
    assert r.status_code == 401
    assert r.json() == {"error": "unauthenticated"}
    assert not seen.body_read


def test_a_stream_arrives_chunk_by_chunk_in_order(bridge: Bridge, seen: Seen) -> None:
    with httpx.stream("GET", bridge.url + "/stream?n=20", headers=AUTH) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text == "".join(f"data: {i}\n\n" for i in range(20))
    # many concurrent streams, each complete and in order
    async def many() -> list[str]:
        async with httpx.AsyncClient(base_url=bridge.url, headers=AUTH) as client:
            async def one() -> str:
                r = await client.get("/stream?n=10")
                return r.text
            return list(await asyncio.gather(*(one() for _ in range(32))))
    want = "".join(f"data: {i}\n\n" for i in range(10))
    assert asyncio.run(many()) == [want] * 32


def test_a_client_that_goes_away_ends_the_apps_stream(bridge: Bridge, seen: Seen) -> None:
    with httpx.stream("GET", bridge.url + "/forever", headers=AUTH) as r:
        assert next(r.iter_bytes()) == b"data: first\n\n"
    assert seen.stream_closed.wait(10), "the app's stream kept running after the client left"


def test_an_app_failure_is_a_500(bridge: Bridge, seen: Seen) -> None:
    r = httpx.get(bridge.url + "/boom", headers=AUTH)
    assert r.status_code == 500
    assert httpx.get(bridge.url + "/hello", headers=AUTH).status_code == 200


def test_sigterm_lets_the_stream_in_flight_finish(bridge: Bridge, seen: Seen) -> None:
    with httpx.stream("GET", bridge.url + "/slow", headers=AUTH) as r:
        chunks = r.iter_bytes()
        assert next(chunks) == b"data: begun\n\n"
        bridge.front.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert bridge.front.poll() is None, "the front exited with a request in flight"
        with pytest.raises(httpx.TransportError):  # no new connections while draining
            httpx.get(bridge.url + "/hello", headers=AUTH, timeout=2)
        seen.release.set()
        assert b"".join(chunks) == b"data: done\n\n"
    bridge.front.wait(10)


def test_the_front_exits_when_the_engine_end_closes(bridge: Bridge, seen: Seen) -> None:
    bridge.close_engine_end()
    assert bridge.front.wait(10) == EXIT_ENGINE_GONE


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("end", ["usage", "plain", "error"])
def test_the_front_renders_a_streams_token_records(bridge: Bridge, chat: bool,
                                                   end: str) -> None:
    r = httpx.get(bridge.url + "/tokens", params={"chat": chat, "end": end}, headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert read_events(r.text) == expected_events(chat, "", end)
    assert list(json.loads(r.text.split("\n\n")[0][6:])) == [  # OpenAI's key order
        "id", "object", "created", "model", "adapterplane", "choices"]


def test_concurrent_token_streams_each_get_their_own_records(bridge: Bridge) -> None:
    async def many() -> list[str]:
        async with httpx.AsyncClient(base_url=bridge.url, headers=AUTH) as client:
            async def one(i: int) -> str:
                r = await client.get("/tokens", params={"chat": True, "tag": f"s{i}:"})
                return r.text
            return list(await asyncio.gather(*(one(i) for i in range(32))))
    for i, text in enumerate(asyncio.run(many())):
        assert read_events(text) == expected_events(True, f"s{i}:", "usage")
