"""The one OS thread that builds the agent's engine and then runs its loop.

On the CPU, torch's intra-op parallelism runs on an OpenMP thread team per calling
thread. An engine built and warmed up on one thread (the daemon's main thread) and
stepped on another serves measurably slower there — SmolLM2 on 2 cores: 0.84x without
adapters and 0.72x with 8, against the same engine stepped on the thread that built it —
so the daemon builds the engine on this thread (`call`) and the engine loop then runs on
it (`run`): every step executes where the engine was made.

A daemon thread, as the loop always was: a wedged step never holds the process at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[object, ...], "Future[Any]"]


class EngineThread:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="engine-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, done = job
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, which raises it
                done.set_exception(exc)

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        done: Future[T] = Future()
        self._jobs.put((fn, args, done))
        return done

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the engine thread and return its result (or raise)."""
        return self.submit(fn, *args).result()

    def shutdown(self) -> None:
        """End the thread once what it runs now returns."""
        self._jobs.put(None)
