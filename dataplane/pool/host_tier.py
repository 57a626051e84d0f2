"""Host tier: an LRU of verified packed artifacts in (pinned) host memory, and a disk cache.

:class:`HostTier` holds :class:`PackedAdapter` images (the exact bytes the
device pages get) under a byte budget; an entry is admitted only after its payload
digest re-verifies and its padding (page tails, rank rows beyond the logical rank) is
zero, so every entry is a *trusted host source* for loads and for compensating
rollback: this O(bytes) verification runs once per image, off the load's critical
path (a device load then only copies and compares on the device; the pool's
``rehash_on_load`` debug mode re-checks both on every load). Evicting an entry makes
any device residency of that key ineligible as a victim (it could not be restored).
Pinned memory is used when CUDA is available so H2D copies can be asynchronous.

:class:`DiskCache` stores downloaded artifact files under their SHA-256 content digest
(``root/sha256/ab/abcdef...``); a write is verified before an atomic rename, so a
reader never sees a partial or mismatched file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch

from dataplane.pool.errors import HostTierError
from dataplane.pool.faults import FaultInjector, FaultPoint
from dataplane.pool.packing import PackedAdapter, payload_digest
from dataplane.pool.page_storage import padding_is_zero

_HEX = frozenset("0123456789abcdef")


class HostTier:
    """LRU of verified packed artifacts keyed by artifact digest, within ``byte_budget``."""

    def __init__(self, byte_budget: int, pin_memory: bool | None = None) -> None:
        if byte_budget <= 0:
            raise HostTierError(f"byte budget must be > 0, got {byte_budget}")
        self.byte_budget = byte_budget
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._entries: OrderedDict[str, PackedAdapter] = OrderedDict()
        self._used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def pinned_count(self) -> int:
        return sum(1 for p in self._entries.values() if p.payload.is_pinned())

    def __contains__(self, digest: object) -> bool:
        return digest in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def digests(self) -> tuple[str, ...]:
        """Least recently used first."""
        return tuple(self._entries)

    def put(self, packed: PackedAdapter) -> list[str]:
        """Verify and insert (most recently used); returns the digests evicted for room."""
        if packed.nbytes > self.byte_budget:
            raise HostTierError(f"{packed.digest}: {packed.nbytes} B exceeds the host budget "
                                f"{self.byte_budget} B")
        if packed.digest in self._entries:
            self._entries.move_to_end(packed.digest)
            return []
        if payload_digest(packed.payload) != packed.bytes_digest:
            raise HostTierError(f"{packed.digest}: payload digest mismatch", reason="digest")
        if not padding_is_zero(packed.plan, packed.payload):
            raise HostTierError(f"{packed.digest}: non-zero padding in the host image",
                                reason="padded_tail")
        if self.pin_memory and not packed.payload.is_pinned():
            packed = replace(packed, payload=packed.payload.pin_memory())
        evicted = []
        while self._used + packed.nbytes > self.byte_budget:
            digest, old = self._entries.popitem(last=False)
            self._used -= old.nbytes
            self.evictions += 1
            evicted.append(digest)
        self._entries[packed.digest] = packed
        self._used += packed.nbytes
        return evicted

    def get(self, digest: str) -> PackedAdapter | None:
        """The entry (touched as most recently used) or ``None``; counts hits/misses."""
        packed = self._entries.get(digest)
        if packed is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(digest)
        return packed

    def peek(self, digest: str) -> PackedAdapter | None:
        return self._entries.get(digest)

    def discard(self, digest: str) -> None:
        packed = self._entries.pop(digest, None)
        if packed is not None:
            self._used -= packed.nbytes


class DiskCache:
    """Content-addressed files: ``get`` returns only a file whose SHA-256 matches its name."""

    def __init__(self, root: Path, faults: FaultInjector | None = None) -> None:
        self.root = Path(root)
        self.faults = faults or FaultInjector()

    def path_for(self, digest: str) -> Path:
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise HostTierError(f"not a lowercase sha256 hex digest: {digest!r}")
        return self.root / "sha256" / digest[:2] / digest

    def get(self, digest: str, verify: bool = True) -> Path | None:
        """The cached file, or ``None``; a corrupt file is removed and reported as a miss."""
        path = self.path_for(digest)
        if not path.is_file():
            return None
        if verify and _file_digest(path) != digest:
            path.unlink(missing_ok=True)
            return None
        return path

    def put_stream(self, digest: str, chunks: Iterable[bytes]) -> Path:
        """Write ``chunks`` to a temp file, verify the digest, then rename into place."""
        path = self.path_for(digest)
        self.faults.hit(FaultPoint.DOWNLOAD, digest=digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if h.hexdigest() != digest:
                raise HostTierError(f"download digest {h.hexdigest()} != {digest}",
                                    reason="digest")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def put_bytes(self, digest: str, data: bytes) -> Path:
        return self.put_stream(digest, [data])

    def put_file(self, digest: str, src: Path, chunk: int = 1 << 20) -> Path:
        with open(src, "rb") as f:
            return self.put_stream(digest, iter(lambda: f.read(chunk), b""))

    def remove(self, digest: str) -> None:
        self.path_for(digest).unlink(missing_ok=True)

    def digests(self) -> list[str]:
        base = self.root / "sha256"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.glob("??/*") if not p.name.startswith("."))


def _file_digest(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
