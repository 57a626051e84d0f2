"""Pieces of the fault drills (test_cp_fault_drills.py): the control plane as real
processes, an HTTP fault proxy in front of S3, a client workload, and the invariants
checked against the database and the store directly.

- `Plane`: `adapterplane api` and `adapterplane worker` subprocesses on one database,
  broker and store (each reached through whatever URL the drill gives, a proxy's port
  included), each with its own TMPDIR, started in their own sessions so a drill can
  SIGKILL one process or a whole worker (its pool children too).
- `S3FaultProxy`: a threaded HTTP server that forwards every request to moto, or answers
  an S3 `InternalError` 500 (`failing = True`), or sleeps first (`delay_s`).
- `Workload`: a client thread that pushes distinct adapters and publishes the validated
  ones in a loop, recording every answer (a refused or cut connection is recorded as
  `status=None`).
- `check_invariants`: what must hold after any drill.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from cp_helpers import free_port, wait_for
from sqlalchemy import Engine, text

from controlplane.storage import ObjectStore

ENTRYPOINT = [sys.executable, "-m", "cli.launcher"]
SCRATCH_PATTERNS = ("adapterplane-scratch-*", "adapterplane-blob-*", "adapterplane-import-*",
                    "adapterplane-validate-*", "adapterplane-verify-*")
RETRYABLE_5XX = {502: "STORAGE_ERROR", 503: "DATABASE_UNAVAILABLE"}
"""The only server errors a client may see during an outage (docs/API.md)."""
EXPECTED_4XX = {"INVALID_STATE", "GENERATION_CONFLICT"}
"""4xx a workload may meet: a publish racing a re-validation never happens here, but a
publish of an artifact the client saw validated is never refused otherwise."""


# ---------------------------------------------------------------- processes


@dataclass
class Plane:
    """The control plane's processes. `env` is shared; `api_env`/`worker_env` override."""

    root: Path
    env: dict[str, str]
    api_port: int = field(default_factory=free_port)
    api: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    started: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def tmpdir(self, role: str) -> Path:
        path = self.root / f"tmp-{role}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _spawn(self, role: str, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        self.started += 1
        log = self.root / f"{role}-{self.started}.log"
        with log.open("wb") as out:
            return subprocess.Popen(
                [*ENTRYPOINT, *args], stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, "TMPDIR": str(self.tmpdir(role)), **env},
                start_new_session=True)

    def start_api(self) -> None:
        proc = self.api = self._spawn("api", ["api", "--port", str(self.api_port),
                                              "--log-level", "warning"])

        def healthy() -> bool:
            assert proc.poll() is None, self.logs("api")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, what="the API to answer /healthz", timeout=30, interval=0.1)

    def start_worker(self, pool: str = "prefork", concurrency: int = 2) -> None:
        ready = self.root / f"worker-ready-{self.started + 1}"
        proc = self.worker = self._spawn(
            "worker", ["worker", "--pool", pool, "--concurrency", str(concurrency),
                       "--ready-file", str(ready)])

        def is_ready() -> bool:
            assert proc.poll() is None, self.logs("worker")
            return ready.exists()

        wait_for(is_ready, what="the worker to be ready", timeout=30, interval=0.1)

    def kill(self, proc: subprocess.Popen[bytes] | None, *, group: bool = False) -> None:
        """SIGKILL the process (with `group`: its whole session, pool children too)."""
        assert proc is not None and proc.poll() is None
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def pool_children(self) -> list[int]:
        assert self.worker is not None
        found = Path(f"/proc/{self.worker.pid}/task/{self.worker.pid}/children").read_text()
        return [int(pid) for pid in found.split()]

    def stop(self) -> None:
        """SIGTERM each live process (graceful shutdown), SIGKILL its session after 20 s."""
        for proc in (self.api, self.worker):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def logs(self, role: str) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:]
                         for p in sorted(self.root.glob(f"{role}-*.log")))

    def leftovers(self, role: str) -> list[str]:
        """Scratch files and dirs under the temp dir of `role` ("api" or "worker")."""
        return sorted(p.name for pattern in SCRATCH_PATTERNS
                      for p in self.tmpdir(role).glob(pattern))


# ---------------------------------------------------------------- S3 faults


class S3FaultProxy:
    """HTTP proxy in front of moto: forwards, or answers 500 (`failing`), or sleeps
    `delay_s` before forwarding."""

    def __init__(self, target_port: int) -> None:
        self.failing = False
        self.delay_s = 0.0
        self.failed = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                if proxy.failing:
                    proxy.failed += 1
                    self._answer(500, {"Content-Type": "application/xml"},
                                 b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                                 b"InternalError</Code><Message>drill</Message></Error>")
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body,
                                     headers=dict(self.headers.items()))
                    response = upstream.getresponse()
                    payload = response.read()
                    headers = {k: v for k, v in response.getheaders()
                               if k.lower() not in ("transfer-encoding", "connection",
                                                    "content-length")}
                    self._answer(response.status, headers, payload,
                                 length=response.getheader("Content-Length")
                                 if self.command == "HEAD" else None)
                finally:
                    upstream.close()

            def _answer(self, status: int, headers: dict[str, str], payload: bytes,
                        length: str | None = None) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a client hung up
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- client workload


@dataclass(frozen=True)
class Answer:
    kind: str  # "push" | "publish"
    status: int | None  # None: the connection was refused or cut
    body: Any = None
    retry_after: str | None = None


class Workload(threading.Thread):
    """Push distinct adapters (every fourth one over the rank limit: it is rejected) and
    publish validated ones to two aliases, until `stop()`."""

    ALIASES = ("bot-a", "bot-b")

    def __init__(self, url: str, token: str, h_base: str, good: Path, bad: Path,
                 seed: int, ns: str = "acme") -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, timeout=30,
                                   headers={"Authorization": f"Bearer {token}"})
        self.h_base, self.good, self.bad, self.ns = h_base, good, bad, ns
        self.rng = random.Random(seed)
        self.answers: list[Answer] = []
        self.pushed: dict[int, str] = {}  # artifact id -> upload_sha256 (2xx pushes)
        self._stopped = threading.Event()
        self.pushes = 0

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=60)
        self.client.close()

    def wait_answers(self, count: int, timeout: float = 30) -> None:
        start = len(self.answers)
        wait_for(lambda: len(self.answers) >= start + count, timeout=timeout,
                 what=f"{count} more workload answers")

    def run(self) -> None:
        while not self._stopped.is_set():
            self.pushes += 1
            self._push(self.pushes)
            if self.pushed:
                self._publish(self.rng.choice(sorted(self.pushed)))
            time.sleep(0.02)

    def _call(self, kind: str, method: str, path: str, **kwargs: Any) -> Answer:
        try:
            r = self.client.request(method, path, **kwargs)
        except httpx.TransportError:
            answer = Answer(kind, None)
        else:
            body = r.json() if r.headers.get("content-type", "").startswith(
                "application/json") else r.text
            answer = Answer(kind, r.status_code, body, r.headers.get("retry-after"))
        self.answers.append(answer)
        return answer

    def _push(self, n: int) -> None:
        adapter = self.bad if n % 4 == 0 else self.good
        # trailing blanks: distinct upload bytes describing the same adapter
        config = (adapter / "adapter_config.json").read_bytes() + b" " * n
        files = {"adapter_config.json": ("adapter_config.json", config),
                 "adapter_model.safetensors": (
                     "adapter_model.safetensors",
                     (adapter / "adapter_model.safetensors").read_bytes())}
        answer = self._call("push", "POST", f"/v1/namespaces/{self.ns}/artifacts",
                            data={"base": self.h_base}, files=files)
        if answer.status in (200, 202):
            self.pushed[int(answer.body["id"])] = str(answer.body["upload_sha256"])

    def _publish(self, artifact_id: int) -> None:
        try:
            r = self.client.get(f"/v1/namespaces/{self.ns}/artifacts/{artifact_id}")
        except httpx.TransportError:
            return
        if r.status_code != 200 or r.json()["state"] != "validated":
            return
        self._call("publish", "POST",
                   f"/v1/namespaces/{self.ns}/aliases/{self.rng.choice(self.ALIASES)}/publish",
                   json={"artifact": str(artifact_id)})


# ---------------------------------------------------------------- invariants


def rows(engine: Engine, sql: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql)))


def unfinished(engine: Engine) -> list[Any]:
    return rows(engine, "SELECT id, state, last_error FROM artifacts "
                        "WHERE state NOT IN ('validated', 'rejected')")


def answers_are_clean(answers: list[Answer]) -> Iterator[str]:
    """Why any answer breaks the error contract (none: it holds)."""
    for a in answers:
        if a.status is None or a.status < 400:
            continue
        code = a.body.get("code") if isinstance(a.body, dict) else None
        if a.status >= 500:
            if RETRYABLE_5XX.get(a.status) != code:
                yield f"{a.kind}: {a.status} {a.body!r}"
            elif a.status == 503 and not (a.retry_after or "").isdigit():
                yield f"{a.kind}: 503 without Retry-After"
        elif code not in EXPECTED_4XX:
            yield f"{a.kind}: {a.status} {a.body!r}"


def check_invariants(engine: Engine, store: ObjectStore, plane: Plane,
                     workloads: list[Workload], *, deadline_s: float = 45) -> dict[str, int]:
    """Assert what holds after every drill; the processes must still run (jobs finish).
    Stops them at the end (graceful) to check the worker's temp dir; what the API left
    in its own is counted (`api_leftovers`), for the caller to judge. Returns counts."""
    answers = [a for w in workloads for a in w.answers]
    assert not list(answers_are_clean(answers)), list(answers_are_clean(answers))
    wait_for(lambda: not unfinished(engine), timeout=deadline_s, interval=0.2,
             what=f"every artifact to finish: {unfinished(engine)}\n{plane.logs('worker')}")
    artifacts = {r.id: r for r in rows(
        engine, "SELECT id, state, upload_sha256, files FROM artifacts")}
    for w in workloads:
        for artifact_id, upload in w.pushed.items():  # a 2xx push has its row
            assert artifacts[artifact_id].upload_sha256 == upload
    for row in artifacts.values():  # bytes before rows: every row's blobs verify
        for name, ref in row.files.items():
            fault = store.blob_fault(ref["sha256"], int(ref["size"]), ref["key"])
            assert fault is None, (row.id, name, fault)
    generations = rows(engine, "SELECT a.id, a.name, a.current_generation, "
                               "array_agg(g.generation ORDER BY g.generation) AS numbers "
                               "FROM aliases a JOIN catalog_generations g ON g.alias_id = a.id "
                               "GROUP BY a.id")
    for alias in generations:
        assert alias.numbers == list(range(1, alias.current_generation + 1)), alias
    published = rows(engine, "SELECT DISTINCT artifact_id FROM catalog_generations "
                             "WHERE artifact_id IS NOT NULL")
    for (artifact_id,) in published:
        assert artifacts[artifact_id].state == "validated", artifacts[artifact_id]
    ok_publishes = [a for a in answers if a.kind == "publish" and a.status in (200, 201)]
    for a in ok_publishes:
        assert any(g.name == a.body["alias"] and g.current_generation >= a.body["generation"]
                   for g in generations), a
    plane.stop()
    assert "request.failed" not in plane.logs("api")
    assert not plane.leftovers("worker"), plane.leftovers("worker")
    return {"artifacts": len(artifacts), "publishes": len(ok_publishes),
            "generations": sum(g.current_generation for g in generations),
            "answers": len(answers), "api_leftovers": len(plane.leftovers("api"))}
