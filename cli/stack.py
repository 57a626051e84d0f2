"""The embedded stack behind `adapterplane up` and `adapterplane demo`.

Real processes, no shortcuts: `adapterplane migrate` and `adapterplane bootstrap-token`
run to completion, then the API (`adapterplane api`, uvicorn) and one Celery worker
(`adapterplane worker`, SQLite broker by default) run as child processes with their
output in `<data_dir>/logs/`. Readiness means `GET /readyz` answers 200 *and* the worker
has signalled `worker_ready` (it touches a ready file). `stop()` sends SIGTERM (uvicorn
graceful shutdown, Celery warm shutdown) and escalates to SIGKILL after a grace period.

Children are started in their own sessions so a terminal Ctrl-C reaches only the
supervisor, which then stops them in order; nothing is left behind.

Settings come from the environment (`ADAPTERPLANE_*`) with `ADAPTERPLANE_DATA_DIR` set
to `data_dir`; with no other variables every store (SQLite DB, file:// objects, SQLite
broker and result backend) lives under `data_dir`. `embedded_only=True` drops any
inherited database/storage/broker variables so the stack is self-contained.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

ENTRYPOINT = [sys.executable, "-m", "cli.launcher"]
TOKEN_FILE = "admin.token"
STORE_ENV_VARS = (
    "ADAPTERPLANE_DATABASE_URL",
    "ADAPTERPLANE_STORAGE_URL",
    "ADAPTERPLANE_S3_BUCKET",
    "ADAPTERPLANE_CELERY_BROKER_URL",
    "ADAPTERPLANE_CELERY_RESULT_BACKEND",
    "ADAPTERPLANE_CELERY_TASK_ALWAYS_EAGER",
)


class StackError(RuntimeError):
    """The embedded stack failed to start or a process died; carries a log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class StopReport:
    """How each child ended: exit status (negative: killed by that signal)."""

    codes: dict[str, int] = field(default_factory=dict)
    killed: list[str] = field(default_factory=list)
    """Children that ignored SIGTERM for the grace period and were SIGKILLed."""

    @property
    def clean(self) -> bool:
        return not self.killed and all(c in (0, -signal.SIGTERM) for c in self.codes.values())

    def describe(self) -> str:
        parts = [f"{name}={code}" for name, code in self.codes.items()]
        return f"{'cleanly' if self.clean else 'with errors'} ({', '.join(parts)})"


@dataclass
class EmbeddedStack:
    """Supervisor of one API and one worker process sharing `data_dir`.

    `port=0` picks a free port. `url` and `token_path` are valid after `start()`.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8400
    embedded_only: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 90.0
    stop_grace_s: float = 20.0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _logs: list[IO[bytes]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.expanduser().resolve()
        if self.port == 0:
            self.port = free_port(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def token_path(self) -> Path:
        return self.data_dir / TOKEN_FILE

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def worker_ready_file(self) -> Path:
        return self.data_dir / "run" / "worker.ready"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.embedded_only:
            for name in STORE_ENV_VARS:
                env.pop(name, None)
        env["ADAPTERPLANE_DATA_DIR"] = str(self.data_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.extra_env)
        return env

    @property
    def running(self) -> bool:
        """True between a successful `start()` and `stop()`."""
        return bool(self._procs)

    def token(self) -> str:
        return self.token_path.read_text().strip()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Migrate, ensure an admin token, start API + worker, wait until both are ready."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.worker_ready_file.parent.mkdir(parents=True, exist_ok=True)
        self.worker_ready_file.unlink(missing_ok=True)
        self._run_once("migrate", ["migrate"])
        if not self.token_path.is_file():
            self._bootstrap_token()
        try:
            self._spawn("api", ["api", "--host", self.host, "--port", str(self.port)])
            self._spawn(
                "worker",
                [
                    "worker",
                    "--pool",
                    "solo",
                    "--concurrency",
                    "1",
                    "--ready-file",
                    str(self.worker_ready_file),
                ],
            )
            self._wait_ready()
            if not self._token_accepted():  # a stale token file from a wiped database
                self._bootstrap_token()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> StopReport:
        """SIGTERM every child, wait `stop_grace_s`, SIGKILL leftovers; report how each ended.

        Idempotent. uvicorn re-raises the SIGTERM it handled after its graceful shutdown,
        so "exited on our SIGTERM" (-15) counts as clean, like exit status 0.
        """
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        report = StopReport()
        for name, proc in self._procs.items():
            try:
                report.codes[name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                report.killed.append(name)
                report.codes[name] = proc.returncode
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        self.worker_ready_file.unlink(missing_ok=True)
        return report

    def check_alive(self) -> None:
        """Raise StackError if a child has exited."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise StackError(
                    f"{name} exited with {proc.returncode}; last log lines:\n"
                    f"{_tail(self.log_dir / f'{name}.log')}"
                )

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps -------------------------------------------------------------------------

    def _run_once(self, name: str, args: list[str]) -> None:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            result = subprocess.run(
                [*ENTRYPOINT, *args],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0:
            raise StackError(
                f"adapterplane {' '.join(args)} failed ({result.returncode}):\n{_tail(log_path)}"
            )

    def _bootstrap_token(self) -> None:
        self.token_path.unlink(missing_ok=True)
        self._run_once(
            "bootstrap-token",
            ["bootstrap-token", "--name", "admin", "--write-to", str(self.token_path)],
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(log)
        self._procs[name] = subprocess.Popen(
            [*ENTRYPOINT, *args],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        api_ready = False
        with httpx.Client(timeout=2.0) as http:
            while True:
                self.check_alive()
                if not api_ready:
                    try:
                        api_ready = http.get(f"{self.url}/readyz").status_code == 200
                    except httpx.HTTPError:
                        api_ready = False
                if api_ready and self.worker_ready_file.exists():
                    return
                if time.monotonic() > deadline:
                    waiting = "API /readyz" if not api_ready else "worker"
                    raise StackError(f"{waiting} not ready after {self.ready_timeout_s:g}s")
                time.sleep(0.2)

    def _token_accepted(self) -> bool:
        response = httpx.get(
            f"{self.url}/v1/namespaces",
            timeout=5.0,
            headers={"Authorization": f"Bearer {self.token()}"},
        )
        return response.status_code != 401
