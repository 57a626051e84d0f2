"""Frames between the agent's HTTP front process and its engine process (one Unix socket).

The front process terminates clients' HTTP connections; the engine process runs the
agent's ASGI app. ASGI's messages cross the socket as frames: a header
(payload length, stream id, kind) and a payload. A stream is one HTTP request.

Front -> engine: REQUEST (the request's scope, JSON), BODY_MORE / BODY_END (a piece of
the request body, answering a RECEIVE), DISCONNECT (the client is gone, answering a
RECEIVE or unasked when the front gives the request up).
Engine -> front: RECEIVE (the app awaits the next request message), START (status and
headers, JSON), CHUNK_MORE / CHUNK_END (a piece of the response body; END completes it).

A streamed answer's body is rendered by the front (agent/sse_chunks.py): after START,
STREAM_OPEN (the stream's spec, JSON), then its token records inside TOKENS frames, then
STREAM_END (`{"usage": ...}`, `{}` or `{"error": ...}`; it completes the response). A
TOKENS frame carries stream 0 and the records of many streams, each record led by its
stream id (JSON `[[sid, index, text, ids, finish, logprobs], ...]`): the records of one
event-loop iteration are one frame.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

HEADER = struct.Struct("!IIB")
"""Payload length, stream id, kind."""

REQUEST, BODY_MORE, BODY_END, DISCONNECT = 1, 2, 3, 4
RECEIVE, START, CHUNK_MORE, CHUNK_END = 11, 12, 13, 14
STREAM_OPEN, TOKENS, STREAM_END = 15, 16, 17
MAX_PAYLOAD = 1 << 30


def frame(stream: int, kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), stream, kind) + payload


def _latin1(pairs: Any) -> list[list[str]]:
    return [[k.decode("latin-1"), v.decode("latin-1")] for k, v in pairs]


def _bytes(pairs: list[list[str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs]


def encode_scope(scope: Mapping[str, Any]) -> bytes:
    """The parts of an HTTP scope the app reads (JSON; bytes as latin-1 text)."""
    return json.dumps({
        "http_version": scope.get("http_version", "1.1"), "method": scope["method"],
        "scheme": scope.get("scheme", "http"), "path": scope["path"],
        "raw_path": (scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
        "query_string": scope.get("query_string", b"").decode("latin-1"),
        "root_path": scope.get("root_path", ""), "headers": _latin1(scope["headers"]),
        "client": scope.get("client"), "server": scope.get("server")}).encode()


def decode_scope(payload: bytes) -> dict[str, Any]:
    doc = json.loads(payload)
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": doc["http_version"], "method": doc["method"],
            "scheme": doc["scheme"], "path": doc["path"],
            "raw_path": doc["raw_path"].encode("latin-1"),
            "query_string": doc["query_string"].encode("latin-1"),
            "root_path": doc["root_path"], "headers": _bytes(doc["headers"]),
            "client": tuple(doc["client"]) if doc["client"] else None,
            "server": tuple(doc["server"]) if doc["server"] else None}


def encode_start(message: Mapping[str, Any]) -> bytes:
    return json.dumps({"status": message["status"],
                       "headers": _latin1(message.get("headers", ()))}).encode()


def decode_start(payload: bytes) -> dict[str, Any]:
    doc = json.loads(payload)
    return {"type": "http.response.start", "status": doc["status"],
            "headers": _bytes(doc["headers"])}


class FrameReader:
    """Frames out of a byte stream (`feed` what arrived; `frames` what is complete)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buf += data
        out: list[tuple[int, int, bytes]] = []
        view, at = memoryview(self._buf), 0
        while len(view) - at >= HEADER.size:
            size, stream, kind = HEADER.unpack_from(view, at)
            if size > MAX_PAYLOAD:
                raise ValueError(f"bridge frame of {size} bytes")
            end = at + HEADER.size + size
            if end > len(view):
                break
            out.append((stream, kind, bytes(view[at + HEADER.size:end])))
            at = end
        view.release()
        del self._buf[:at]
        return out
