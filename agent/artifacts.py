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

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx

from agent.catalog import ArtifactInfo, CollectionLink, LoadFailed
from dataplane.artifacts import BaseModelABI
from dataplane.collections import CollectionError, read_bundle
from dataplane.collections.bundle import CollectionBundle
from dataplane.engine.adapters import AdapterError, LoadedAdapter, load_peft_adapter
from dataplane.engine.native_members import BUNDLE_FILES, NativeMember, member_mismatch
from dataplane.identity import activation_policy_sha256, h_adapter_semantic
from dataplane.pool.errors import PoolError
from dataplane.pool.faults import FaultInjector
from dataplane.pool.host_tier import DiskCache

log = logging.getLogger(__name__)
CHUNK = 1 << 20
ALLOWED_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors"})


def assemble_verified(cache: DiskCache, files: Mapping[str, Mapping[str, Any]], target: Path,
                      *, link: bool = False) -> tuple[Path, list[int | None]]:
    """Directory `target` holding `files` (`{name: {"sha256", "url"}}`), each downloaded
    through the digest-checked `cache` and published by one atomic rename; with the bytes
    each file downloaded (None: a cache hit). `link`: hard-link the cache files instead of
    copying them where the file system allows (large checkpoints)."""
    paths: dict[str, Path] = {}
    fetched: list[int | None] = []
    for name, meta in sorted(files.items()):
        sha = str(meta["sha256"])
        try:
            cached = cache.get(sha)
            if cached is None:
                cached = cache.put_stream(sha, stream_url(str(meta["url"])))
                fetched.append(cached.stat().st_size)
            else:
                fetched.append(None)
        except (PoolError, OSError, httpx.HTTPError) as exc:
            raise LoadFailed(f"download of {name} failed: {exc}", file=name) from exc
        paths[name] = cached
    staging = target.parent / f".staging-{target.name}-{os.getpid()}-{time.monotonic_ns()}"
    staging.mkdir(parents=True)
    try:
        for name, src in paths.items():
            _place(src, staging / name, link)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, fetched


def _place(src: Path, dest: Path, link: bool) -> None:
    if link:
        with contextlib.suppress(OSError):  # another file system: copy
            os.link(src, dest)
            return
    shutil.copyfile(src, dest)


def stream_url(url: str) -> Iterator[bytes]:
    """The bytes at a file:// or http(s):// (presigned) URL, in chunks."""
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


class ArtifactFetcher:
    """Fetch + verify + load; safe to call from several loader threads at once."""

    def __init__(self, cache_dir: Path, base: BaseModelABI, max_rank: int,
                 delay_load_s: float = 0.0,
                 faults: FaultInjector | None = None, native_collections: bool = False
                 ) -> None:
        self.cache = DiskCache(cache_dir / "blobs", faults)
        self.dirs = cache_dir / "adapters"
        self.base = base
        self.max_rank = max_rank
        self.delay_load_s = delay_load_s
        self.native_collections = native_collections
        """Return collection members as `NativeMember`s (the engine has collection blocks)."""
        self.native_refused: dict[str, str] = {}
        """H_artifact -> why a linked member is served as a plain LoRA."""
        self._bundles: dict[str, CollectionBundle] = {}
        self._bundle_lock = threading.Lock()
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
        return self.assemble(info.files, info.digest)

    def assemble(self, files: Mapping[str, Mapping[str, Any]], key: str) -> Path:
        """A directory `key` of `files` (`{name: {"sha256", "url"}}`), each downloaded
        through the digest-checked cache, published by one atomic rename."""
        target, fetched = assemble_verified(self.cache, files, self.dirs / key)
        for nbytes in fetched:
            if nbytes is None:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
                self.downloaded_bytes += nbytes
        return target

    def cache_bytes(self) -> int:
        """Bytes of verified artifact files in the disk cache."""
        return sum(self.cache.path_for(d).stat().st_size for d in self.cache.digests())

    def load(self, info: ArtifactInfo) -> LoadedAdapter:
        """Fetch, then read the factors; checks the semantic digest end to end. With
        `native_collections`, a collection member comes back as a `NativeMember` when its
        factors check out against the collection's bundle."""
        directory = self.fetch(info)
        if self.delay_load_s:
            time.sleep(self.delay_load_s)
        try:
            loaded = load_peft_adapter(directory, self.base, self.max_rank)
        except AdapterError as exc:
            raise LoadFailed(f"adapter rejected by the engine: {exc}",
                             artifact=info.digest) from exc
        # the activation policy comes from the downloaded config, which H_artifact covers
        expected = h_adapter_semantic(self.base.h_base, info.digest,
                                      activation_policy_sha256(loaded.invocation_tokens))
        if loaded.digest != expected:
            raise LoadFailed("downloaded adapter does not match its catalog digest",
                             artifact=info.digest)
        if self.native_collections and info.collection is not None:
            return self._native(info, info.collection, loaded)
        return loaded

    def _native(self, info: ArtifactInfo, link: CollectionLink, loaded: LoadedAdapter
                ) -> LoadedAdapter:
        """`loaded` as a NativeMember of its collection, or unchanged (logged) when the
        bundle cannot be had or does not materialise exactly these factors."""
        try:
            if set(link.files) != BUNDLE_FILES:
                raise LoadFailed("collection files are not a bundle", files=sorted(link.files))
            with self._bundle_lock:
                bundle = self._bundles.get(link.digest)
                if bundle is None:
                    bundle = read_bundle(self.assemble(link.files, f"collection-{link.digest}"))
                    self._bundles = {link.digest: bundle}  # the latest collection only
            reason = (member_mismatch(bundle, link.member, loaded)
                      if bundle.h_collection == link.digest else "H_collection differs")
        except (LoadFailed, CollectionError) as exc:
            reason = f"bundle unavailable: {exc}"
        if reason is not None:
            self.native_refused[info.digest] = reason
            log.warning("artifact %s served as a plain LoRA, not from collection %s: %s",
                        info.digest[:12], link.digest[:12], reason)
            return loaded
        return NativeMember(loaded.modules, loaded.digest, loaded.source, loaded.specs,
                            bundle=bundle, member=link.member)
