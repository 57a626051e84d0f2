"""The HTTP bridge: a real front process (`python -m agent.http_frontend`, uvicorn) relays
real HTTP requests to an ASGI app served by `BridgeProtocol` on a Unix socket (as
`serve_bridge` serves it, the connections kept so a test can close them)."""

from __future__ import annotations

import asyncio
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

from agent.http_bridge import BridgeProtocol
from agent.http_frontend import EXIT_ENGINE_GONE
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


class Seen:
    def __init__(self) -> None:
        self.body_read = False
        self.stream_closed = threading.Event()
        self.release = threading.Event()


def make_app(seen: Seen) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def gate(request: Request, call_next: Any) -> Response:
        if request.headers.get("authorization") != "Bearer ok":
            return JSONResponse({"error": "unauthenticated"}, status_code=401)
        return await call_next(request)

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

    return app


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
