"""A TCP proxy between a client process and a real server, for fault drills.

`TcpProxy(target_port)` listens on a free loopback port and pipes each connection to
`127.0.0.1:target_port`. `down()` closes every piped connection and refuses new ones
(the server looks dead to the client: connection refused); `up()` accepts again on
the same port. `reset()` drops the open connections but keeps accepting (what a
server restart or an idle-timeout close does to a client's kept-alive connections).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from agent.supervisor import free_port


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TcpProxy:
        self.up()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.down()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:  # shut down first: a thread blocked reading it wakes up at once
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns.update((client, server))
                self.accepted += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
