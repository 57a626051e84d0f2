"""Host cost of the scheduler's KV capacity checks over the engine's unified pool.

Every step the scheduler asks the block manager whether each sequence that grows a block
can get it (`can_append`), and whether each waiting request fits (`can_allocate`). Over the
unified pool a page count includes the pages of idle (evictable) adapters that KV growth may
evict, and counting those scans every resident. This times admissions of `--seqs`
requests and `--rounds` × `--seqs` append checks, with `--residents` idle adapters in the
pool and plenty of free pages (the common case), against the same calls over a plain free
list (`FreeListPagePool`, the baseline, same run).

    python3 bench/kv_capacity.py --out /tmp/kvcap
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataplane.core import SamplingParams
from dataplane.kvcache.block_manager import BlockManager
from dataplane.kvcache.page_pool import FreeListPagePool, PagePool
from dataplane.kvcache.prefix_key import CacheABI
from dataplane.pool.device_pool import DevicePool
from dataplane.pool.host_tier import HostTier
from dataplane.pool.kv_view import KvPageView
from dataplane.pool.packing import pack_adapter
from dataplane.pool.page_demand import PageGeometry
from dataplane.pool.transactions import LoadRequest, admit
from dataplane.sequence import Sequence


def pool_view(residents: int, pages: int) -> KvPageView:
    """A unified pool holding `residents` idle one-module adapters, reclaimable for KV."""
    geo = PageGeometry(page_elems=64, elem_bytes=4)
    host = HostTier(1 << 28, pin_memory=False)
    gen = torch.Generator().manual_seed(0)
    for i in range(residents):
        factors = {(0, "q_proj"): (torch.randn(2, 8, generator=gen),
                                   torch.randn(8, 2, generator=gen), Fraction(1))}
        host.put(pack_adapter(f"a{i}", factors, geo, torch.float32))
    pool = DevicePool(geo, pages, max(residents, 1), torch.float32, host_tier=host,
                      full_audit=False)
    for i in range(residents):
        admit(pool, LoadRequest(f"a{i}"))
    return KvPageView(pool, reclaim=True)


def time_checks(pages: PagePool, seqs: int, rounds: int) -> float:
    """Seconds for `seqs` admissions (can_allocate + allocate) and `rounds` x `seqs`
    can_append checks."""
    bm = BlockManager(pages, CacheABI(base_digest="0" * 64, kv_dtype="float32",
                                      block_size=16))
    batch = [Sequence(f"r{i}", tuple(range(1, 33)), SamplingParams()) for i in range(seqs)]
    start = time.perf_counter()
    for seq in batch:
        if not bm.can_allocate(seq):
            raise RuntimeError("the bench pool is too small")
        bm.allocate(seq)
    for _ in range(rounds):
        for seq in batch:
            bm.can_append(seq)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--residents", type=int, default=128)
    p.add_argument("--seqs", type=int, default=128)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    checks = args.seqs * (args.rounds + 1)
    rows = []
    for name in ("unified pool", "free list"):
        best = min(time_checks(pool_view(args.residents, args.pages) if name == "unified pool"
                               else FreeListPagePool(args.pages), args.seqs, args.rounds)
                   for _ in range(args.repeats))
        rows.append({"pages": name, "residents": args.residents if name == "unified pool"
                     else 0, "checks": checks, "total_ms": 1e3 * best,
                     "us_per_check": 1e6 * best / checks})
    rows[0]["vs_free_list"] = rows[0]["total_ms"] / rows[1]["total_ms"]
    (args.out / "kv_capacity.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))


if __name__ == "__main__":
    main()
