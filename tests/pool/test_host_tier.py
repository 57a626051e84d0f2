"""Host tier LRU under a byte budget; digest-keyed disk cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dataplane.pool.errors import HostTierError, InjectedFault
from dataplane.pool.faults import FaultAction, FaultInjector, FaultPoint, FaultSpec
from dataplane.pool.host_tier import DiskCache, HostTier

from .builders import packed


def test_lru_within_byte_budget() -> None:
    imgs = {k: packed(k, i) for i, k in enumerate("abcd")}
    size = imgs["a"].nbytes
    tier = HostTier(byte_budget=3 * size, pin_memory=False)
    for k in "abc":
        assert tier.put(imgs[k]) == []
    assert tier.get("a") is imgs["a"]  # a becomes most recent
    assert tier.put(imgs["d"]) == ["b"]  # least recently used goes
    assert tier.digests() == ("c", "a", "d")
    assert tier.used_bytes == 3 * size <= tier.byte_budget
    assert tier.get("b") is None and (tier.hits, tier.misses, tier.evictions) == (1, 1, 1)


def test_rejects_corrupt_or_oversized() -> None:
    img = packed("a", 0)
    tier = HostTier(byte_budget=img.nbytes, pin_memory=False)
    img.payload[0, 0] += 1
    with pytest.raises(HostTierError, match="digest"):
        tier.put(img)
    assert len(tier) == 0
    with pytest.raises(HostTierError, match="exceeds"):
        HostTier(byte_budget=img.nbytes - 1, pin_memory=False).put(packed("b", 1))


def test_disk_cache_is_content_addressed(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    data = b"adapter bytes" * 1000
    digest = hashlib.sha256(data).hexdigest()
    assert cache.get(digest) is None
    path = cache.put_bytes(digest, data)
    assert path == tmp_path / "sha256" / digest[:2] / digest
    assert cache.get(digest) == path and path.read_bytes() == data
    assert cache.digests() == [digest]
    with pytest.raises(HostTierError, match="digest"):
        cache.put_bytes(hashlib.sha256(b"other").hexdigest(), data)
    assert cache.digests() == [digest]  # no partial file left behind
    path.write_bytes(b"rotten")
    assert cache.get(digest) is None and not path.exists()
    with pytest.raises(HostTierError):
        cache.path_for("../../etc/passwd")


def test_download_fault(tmp_path: Path) -> None:
    faults = FaultInjector()
    faults.arm(FaultPoint.DOWNLOAD, FaultSpec(FaultAction.FAIL))
    cache = DiskCache(tmp_path, faults)
    data = b"x"
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(InjectedFault):
        cache.put_bytes(digest, data)
    assert cache.put_bytes(digest, data).read_bytes() == data  # fired once


def test_padding_is_verified_once_at_admission() -> None:
    """A host image with garbage in a page tail never enters the tier (loads from the
    tier then skip the O(bytes) host scan; see HostTier's docstring)."""
    from dataclasses import replace

    from dataplane.pool.packing import payload_digest
    from dataplane.pool.page_demand import PageGeometry

    geo = PageGeometry(page_elems=12, elem_bytes=2)  # rows of 8: tail of 4 per page
    img = packed("x", 1, geo)
    bad = img.payload.clone()
    bad[0, 10] = 1.0
    forged = replace(img, payload=bad, bytes_digest=payload_digest(bad))  # digest agrees
    tier = HostTier(1 << 20, pin_memory=False)
    with pytest.raises(HostTierError) as err:
        tier.put(forged)
    assert err.value.detail["reason"] == "padded_tail" and len(tier) == 0
    assert tier.put(img) == [] and "x" in tier
