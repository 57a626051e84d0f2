"""Per-process scratch space of worker processes: `<tmp>/adapterplane-scratch-<pid>/`.

Each process that runs jobs points `tempfile.tempdir` at its own scratch root
(`use_process_scratch`), so every temp file and directory of a job (fetched blobs,
bundles, read-backs) lies under one directory named after the process. A process
killed with SIGKILL cannot clean up; the next worker to start removes every scratch
root whose pid is not alive (`remove_stale_scratch`). A root whose pid was reused by
an unrelated live process is kept until a worker starts after that process ended.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "adapterplane-scratch-"

_base: Path | None = None


def _base_dir() -> Path:
    """The system temp dir, as it was before this process pointed `tempdir` at a root."""
    global _base
    if _base is None:
        _base = Path(tempfile.gettempdir())
    return _base


def scratch_root(pid: int | None = None) -> Path:
    return _base_dir() / f"{SCRATCH_PREFIX}{os.getpid() if pid is None else pid}"


def use_process_scratch() -> Path:
    """Create this process's scratch root and make it the default temp dir."""
    root = scratch_root()
    root.mkdir(mode=0o700, exist_ok=True)
    tempfile.tempdir = str(root)
    return root


def remove_own_scratch() -> None:
    root = scratch_root()
    if tempfile.tempdir == str(root):
        tempfile.tempdir = None
    shutil.rmtree(root, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale_scratch() -> list[Path]:
    """Remove the scratch roots of processes that are gone; return what was removed."""
    removed: list[Path] = []
    for entry in _base_dir().glob(f"{SCRATCH_PREFIX}*"):
        suffix = entry.name[len(SCRATCH_PREFIX):]
        if not suffix.isdigit() or not entry.is_dir() or pid_alive(int(suffix)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    if removed:
        log.info("removed %d stale scratch dir(s): %s", len(removed),
                 ", ".join(p.name for p in removed))
    return removed
