"""Fetch the checkpoint of a merged release (a base registered by a merge job) to serve it.

An agent started with `base_release = H_base` asks the control plane for that base's
files (`GET /v1/bases/{h_base}/checkpoint`: SHA-256, size and a download URL each), pulls
each through the digest-checked disk cache (a file whose bytes differ is never kept) and
publishes the directory `cache_dir/bases/H_base` by one atomic rename. The engine then
loads it like any model directory, and the daemon refuses to serve unless the loaded
checkpoint re-derives the same H_base: what the agent serves is the registered release,
whatever the storage returned.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from agent.artifacts import assemble_verified
from agent.catalog import LoadFailed
from agent.sync import ControlPlaneClient
from dataplane.pool.host_tier import DiskCache

log = logging.getLogger(__name__)

H_BASE = re.compile(r"^[0-9a-f]{64}$")


class ReleaseUnavailable(RuntimeError):
    """The release's checkpoint cannot be fetched or is not what the registry names."""


def fetch_base_release(client: ControlPlaneClient, h_base: str, cache_dir: Path) -> Path:
    """The verified directory of merged base `h_base` (downloaded unless cached)."""
    if not H_BASE.match(h_base):
        raise ReleaseUnavailable(f"base_release must be an H_base (64 hex), got {h_base!r}")
    doc = client.base_checkpoint(h_base)
    if doc.h_base != h_base:
        raise ReleaseUnavailable(f"the control plane answered base {doc.h_base}")
    files = {name: f.model_dump() for name, f in doc.files.items()}
    try:
        target, fetched = assemble_verified(DiskCache(cache_dir / "blobs"), files,
                                            cache_dir / "bases" / h_base, link=True)
    except LoadFailed as exc:
        raise ReleaseUnavailable(f"merged release {doc.h_merged}: {exc.message}") from exc
    log.info("merged release %s (base %s): %d files, %d downloaded bytes", doc.h_merged,
             h_base, len(files), sum(n for n in fetched if n is not None))
    return target


def check_served_base(loaded: str, wanted: str) -> None:
    """Raise unless the checkpoint the engine loaded is the release's base."""
    if loaded != wanted:
        raise ReleaseUnavailable(f"the downloaded checkpoint derives H_base {loaded}, not the "
                                 f"release's {wanted}")
