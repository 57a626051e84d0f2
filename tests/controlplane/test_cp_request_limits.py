"""Bodies are authenticated before they are read and capped while they stream in.

A real uvicorn server and a raw socket: the client sends headers (and, for the caps,
only part of a body) and the server must answer without waiting for the rest, so a
server that read first would leave the socket silent until the read timeout.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cp_helpers import LiveServer, bootstrap_token, close_app, make_settings

from controlplane.app import create_app

MAX_ARTIFACT = 256 * 1024
JSON_LIMIT = 4096


@pytest.fixture
def server(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    settings = make_settings(sqlite_url, tmp_path / "var", max_artifact_bytes=MAX_ARTIFACT,
                             max_json_body_bytes=JSON_LIMIT)
    app = create_app(settings)
    token = bootstrap_token(settings)
    with LiveServer(app) as live:
        yield live, token
    close_app(app)


def _send(live: LiveServer, head: str, body_parts: list[bytes]) -> tuple[int, dict[str, str],
                                                                          dict[str, object]]:
    """Send `head` and `body_parts` (never the end of the body); read one response."""
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(head.encode())
        for part in body_parts:
            sock.sendall(part)
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)  # socket.timeout here: the server kept reading
            if not chunk:
                break
            raw += chunk
        header_blob, _, rest = raw.partition(b"\r\n\r\n")
        lines = header_blob.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(rest[:length])


def _head(path: str, *, token: str | None, extra: str) -> str:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}\r\n"


@pytest.mark.parametrize("token", [None, "ap_" + "x" * 43])
@pytest.mark.parametrize("path", ["/v1/namespaces", "/v1/namespaces/acme/artifacts",
                                  "/v1/no-such-route"])
def test_unauthenticated_body_is_never_read(server: tuple[LiveServer, str], path: str,
                                            token: str | None) -> None:
    live, _ = server
    declared = _head(path, token=token, extra="Content-Type: application/json\r\n"
                     "Content-Length: 300000000\r\n")
    chunked = _head(path, token=token, extra="Content-Type: multipart/form-data; boundary=b\r\n"
                    "Transfer-Encoding: chunked\r\n")
    for head in (declared, chunked):
        status, _, body = _send(live, head, [])
        assert (status, body["code"]) == (401, "UNAUTHENTICATED")


def test_json_body_is_cut_off_at_the_limit_even_when_chunked(
        server: tuple[LiveServer, str]) -> None:
    live, token = server
    head = _head("/v1/namespaces", token=token,
                 extra="Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
    part = b'{"name": "' + b"x" * 1024
    chunks = [b"%x\r\n%s\r\n" % (len(part), part)] * (JSON_LIMIT // len(part) + 1)
    status, _, body = _send(live, head, chunks)  # the body never ends
    assert (status, body["code"]) == (413, "REQUEST_TOO_LARGE")
    assert body["detail"]["limit_bytes"] == JSON_LIMIT
    declared = _head("/v1/namespaces", token=token, extra="Content-Type: application/json\r\n"
                     f"Content-Length: {JSON_LIMIT + 1}\r\n")
    status, _, body = _send(live, declared, [])
    assert (status, body["code"]) == (413, "REQUEST_TOO_LARGE")


def test_upload_stops_being_read_past_the_artifact_limit(
        server: tuple[LiveServer, str]) -> None:
    live, token = server
    head = _head("/v1/namespaces/acme/artifacts", token=token,
                 extra="Content-Type: multipart/form-data; boundary=BOUNDARY\r\n"
                       "Transfer-Encoding: chunked\r\n")
    opening = (b'--BOUNDARY\r\nContent-Disposition: form-data; name="adapter_model.safetensors";'
               b' filename="w"\r\nContent-Type: application/octet-stream\r\n\r\n')
    data = b"\0" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(opening), opening)]
    chunks += [b"%x\r\n%s\r\n" % (len(data), data)] * (MAX_ARTIFACT // len(data) + 3)
    status, _, body = _send(live, head, chunks)  # the upload never ends
    assert (status, body["code"]) == (413, "ARTIFACT_TOO_LARGE")
    declared = _head("/v1/namespaces/acme/artifacts", token=token,
                     extra="Content-Type: multipart/form-data; boundary=B\r\n"
                           "Content-Length: 300000000\r\n")
    status, _, body = _send(live, declared, [])
    assert (status, body["code"]) == (413, "ARTIFACT_TOO_LARGE")
