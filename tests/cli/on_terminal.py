"""Run `adapterctl` as a subprocess whose stderr is a pseudo-terminal (a person watching)
and whose stdout is a pipe, as `adapterctl push ... > artifact.txt` in a terminal is."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from dataclasses import dataclass

PROGRESS_BAR = "━"
"""The character rich draws progress bars with."""


@dataclass(frozen=True)
class TerminalRun:
    returncode: int
    stdout: str
    terminal: str
    """Everything written to stderr (the terminal), control sequences included."""


def adapterctl_on_terminal(url: str, token: str, *args: str, timeout_s: float = 120.0
                           ) -> TerminalRun:
    """`python -m cli.main ARGS` with stderr on a pty (80 columns, TERM=xterm)."""
    master, slave = pty.openpty()
    env = {**os.environ, "ADAPTERPLANE_URL": url, "ADAPTERPLANE_TOKEN": token,
           "TERM": "xterm", "COLUMNS": "100"}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = bytearray()
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end of the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        returncode = proc.wait(timeout=timeout_s)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return TerminalRun(returncode, stdout, seen.decode(errors="replace"))
