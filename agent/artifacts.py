"""Download artifacts from object storage into a digest-keyed disk cache and load them.

Each file of an artifact arrives with its SHA-256 and a URL (`file://` for the
embedded file store, `http(s)://` presigned for S3). Bytes go through
:class:`dataplane.pool.host_tier.DiskCache`, which verifies the digest before an
atomic rename, so a killed download leaves nothing a restart could trust. The PEFT
directory handed to the engine is assembled from verified cache files; the engine's
reader re-validates it against the base ABI and the resulting semantic digest must
equal `H_adapter_semantic(H_base, H_artifact)` of the catalog entry — a different
adapter can never be loaded under this name.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx

from agent.catalog import ArtifactInfo, LoadFailed
from dataplane.artifacts import BaseModelABI
from dataplane.engine.adapters import AdapterError, LoadedAdapter, load_peft_adapter
from dataplane.identity import h_adapter_semantic
from dataplane.pool.errors import PoolError
from dataplane.pool.faults import FaultInjector
from dataplane.pool.host_tier import DiskCache

CHUNK = 1 << 20
ALLOWED_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors"})


class ArtifactFetcher:
    """Fetch + verify + load; safe to call from several loader threads at once."""

    def __init__(self, cache_dir: Path, base: BaseModelABI, max_rank: int,
                 fail_download: bool = False, delay_load_s: float = 0.0,
                 faults: FaultInjector | None = None) -> None:
        self.cache = DiskCache(cache_dir / "blobs", faults)
        self.dirs = cache_dir / "adapters"
        self.base = base
        self.max_rank = max_rank
        self.fail_download = fail_download
        self.delay_load_s = delay_load_s
        self.cache_hits = 0
        self.cache_misses = 0
        self.downloaded_bytes = 0
        for leftover in self.dirs.glob(".staging-*"):  # a previous process died mid-fetch
            shutil.rmtree(leftover, ignore_errors=True)

    def fetch(self, info: ArtifactInfo) -> Path:
        """A PEFT directory whose files all match the catalog's digests."""
        if not info.files or set(info.files) - ALLOWED_FILES:
            raise LoadFailed("artifact files are not a PEFT LoRA pair",
                             files=sorted(info.files))
        paths: dict[str, Path] = {}
        for name, meta in sorted(info.files.items()):
            sha = str(meta["sha256"])
            try:
                cached = self.cache.get(sha)
                if cached is None:
                    self.cache_misses += 1
                    if self.fail_download:
                        raise LoadFailed("download refused by fault injection", file=name)
                    cached = self.cache.put_stream(sha, self._stream(str(meta["url"])))
                    self.downloaded_bytes += cached.stat().st_size
                else:
                    self.cache_hits += 1
            except (PoolError, OSError, httpx.HTTPError) as exc:
                raise LoadFailed(f"download of {name} failed: {exc}", file=name) from exc
            paths[name] = cached
        target = self.dirs / info.digest
        staging = self.dirs / f".staging-{info.digest}-{os.getpid()}-{time.monotonic_ns()}"
        staging.mkdir(parents=True)
        try:
            for name, src in paths.items():
                shutil.copyfile(src, staging / name)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def cache_bytes(self) -> int:
        """Bytes of verified artifact files in the disk cache."""
        return sum(self.cache.path_for(d).stat().st_size for d in self.cache.digests())

    def _stream(self, url: str) -> Iterator[bytes]:
        parsed = urlparse(url)
        if parsed.scheme == "file":
            with open(unquote(parsed.path), "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
        elif parsed.scheme in ("http", "https"):
            with httpx.stream("GET", url, timeout=60.0) as response:
                response.raise_for_status()
                yield from response.iter_bytes(CHUNK)
        else:
            raise LoadFailed(f"unsupported artifact URL scheme {parsed.scheme!r}")

    def load(self, info: ArtifactInfo) -> LoadedAdapter:
        """Fetch, then read the factors; checks the semantic digest end to end."""
        directory = self.fetch(info)
        if self.delay_load_s:
            time.sleep(self.delay_load_s)
        try:
            loaded = load_peft_adapter(directory, self.base, self.max_rank)
        except AdapterError as exc:
            raise LoadFailed(f"adapter rejected by the engine: {exc}",
                             artifact=info.digest) from exc
        expected = h_adapter_semantic(self.base.h_base, info.digest)
        if loaded.digest != expected:
            raise LoadFailed("downloaded adapter does not match its catalog digest",
                             artifact=info.digest)
        return loaded
