"""Progress bars for uploads, downloads and waits, for a person watching a terminal.

Shown on stderr, and only when stderr is a terminal and the output is a table: a CI log
or a `-o json` pipeline gets the same plain lines as before and no control sequences.
`Progress.off()` is the object the commands use otherwise; every method is a no-op.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from rich import progress as bars
from rich.console import Console

from cli.context import CliContext, OutputFormat

Advance = Callable[[int], None]
"""Called with the number of bytes just moved."""


def wanted(cli: CliContext) -> bool:
    """Whether `cli`'s invocation shows progress: table output to a terminal's stderr."""
    return cli.output is OutputFormat.TABLE and sys.stderr.isatty()


class Progress:
    """Byte bars (`transfer`) and a state spinner (`waiting`) on one live stderr display.

    Use as a context manager; the display stops (its last frame left on screen) on exit.
    """

    def __init__(self, enabled: bool) -> None:
        self._bars: bars.Progress | None = None
        if enabled:
            self._bars = bars.Progress(
                bars.SpinnerColumn(),
                bars.TextColumn("{task.description}"),
                bars.BarColumn(),
                bars.DownloadColumn(),
                bars.TransferSpeedColumn(),
                bars.TimeElapsedColumn(),
                console=Console(file=sys.stderr),
            )

    @classmethod
    def of(cls, cli: CliContext) -> Progress:
        return cls(wanted(cli))

    @classmethod
    def off(cls) -> Progress:
        return cls(False)

    @property
    def enabled(self) -> bool:
        return self._bars is not None

    def __enter__(self) -> Progress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bars is not None:
            self._bars.stop()

    def transfer(self, description: str, total: int | None) -> Advance:
        """A byte bar of `total` bytes (None: unknown); returns its `advance`."""
        if self._bars is None:
            return _ignore
        bar, task = self._bars, self._bars.add_task(description, total=total)
        return lambda n: bar.advance(task, n)

    @contextmanager
    def waiting(self, description: str) -> Iterator[Callable[[str], None]]:
        """A spinner with elapsed time; yields `show(state)`, which labels it with a state.
        The spinner is removed when the wait ends."""
        if self._bars is None:
            yield _ignore_state
            return
        bar = self._bars
        task = bar.add_task(description, total=None)
        try:
            yield lambda state: bar.update(task, description=f"{description}: {state}")
        finally:
            bar.remove_task(task)

    def reader(self, name: str, source: io.BufferedReader) -> io.BufferedReader:
        """`source`, an open file named `name`, with a bar advancing as it is read: the
        same object when progress is off, otherwise a new one on `source`'s raw file
        (`source` is detached; close the returned reader)."""
        if self._bars is None:
            return source
        size = os.fstat(source.fileno()).st_size
        return _CountingReader(source.detach(), self.transfer(f"upload {name}", size))


def _ignore(_n: int) -> None:
    return None


def _ignore_state(_state: str) -> None:
    return None


class _CountingReader(io.BufferedReader):
    """A buffered binary file whose reads advance a bar.

    httpx's multipart encoder sizes a file with `fileno()`, rewinds it with `seek(0)` and
    reads it in chunks; a rewind after bytes were counted does not count them again (the
    bar shows the bytes read at least once).
    """

    def __init__(self, raw: io.RawIOBase, advance: Advance) -> None:
        super().__init__(raw)
        self._advance = advance
        self._high = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        end = self.tell()
        if end > self._high:
            self._advance(end - self._high)
            self._high = end
        return chunk
