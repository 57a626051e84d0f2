"""The LoRA kernel benchmark's cases: scenarios, the peers' numbers, the layer ring.

A :class:`Scenario` is one LoRA-wrapped linear step (decode: T rows, one per request,
adapter = row % n, rows shuffled; prefill: n requests of T/n contiguous rows; mixed: 104
decode rows over slots 3..n-1, then T - 104 prefill rows in 3 runs on slots 0-2). Each is
timed over a ring of independent :class:`Layer` objects sized so that one sweep touches
>= ``RING_BYTES`` and factors stream from HBM; its floor is
:meth:`Scenario.floor_bytes` / copy bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dataplane.kernels import LoraFactorTable

DT = torch.bfloat16
RING_BYTES = 256 << 20
# BENCHMARKS.md, best peer per (r, scenario) (µs) and which.
PEER = {
    (16, "decode T=64 n=1"): (9.4, "vLLM"), (16, "decode T=64 n=16"): (16.1, "vLLM"),
    (16, "decode T=64 n=64"): (23.8, "SGLang csgmv"), (16, "decode T=256 n=1"): (16.3, "SGLang"),
    (16, "decode T=256 n=16"): (24.7, "vLLM"), (16, "decode T=256 n=64"): (26.1, "SGLang csgmv"),
    (16, "prefill T=4096 n=4"): (56.0, "vLLM"), (16, "prefill T=4096 n=32"): (70.9, "SGLang"),
    (64, "decode T=64 n=1"): (11.4, "vLLM"), (64, "decode T=64 n=16"): (27.2, "vLLM"),
    (64, "decode T=64 n=64"): (66.1, "SGLang csgmv"), (64, "decode T=256 n=1"): (20.3, "vLLM"),
    (64, "decode T=256 n=16"): (27.5, "vLLM"), (64, "decode T=256 n=64"): (61.5, "vLLM"),
    (64, "prefill T=4096 n=4"): (85.0, "vLLM"), (64, "prefill T=4096 n=32"): (168.7, "vLLM"),
}  # fmt: skip


MIXED_DECODE_ROWS = 104  # one-row decode slots of a "mixed" step (n - 3 slots)


@dataclass(frozen=True)
class Scenario:
    kind: str  # "decode" | "prefill" | "mixed"
    rows: int
    n: int
    ranks: tuple[int, ...]  # slot s has ranks[s % len]
    outs: tuple[int, ...] = (4096,)
    d_in: int = 4096
    pool: int = 0  # slots in the factor table (0: n); rows use the first n

    @property
    def slots(self) -> int:
        return max(self.pool, self.n)

    @property
    def name(self) -> str:
        return f"{self.kind} T={self.rows} n={self.n}"

    @property
    def max_rank(self) -> int:
        return max(self.ranks)

    def row_slot(self, gen: torch.Generator) -> list[int]:
        if self.kind == "decode":
            slots = [t % self.n for t in range(self.rows)]
            return [slots[i] for i in torch.randperm(self.rows, generator=gen).tolist()]
        if self.kind == "mixed":  # decode rows over slots 3.., then 3 prefill runs
            decode = [3 + t % (self.n - 3) for t in range(MIXED_DECODE_ROWS)]
            per = -(-(self.rows - MIXED_DECODE_ROWS) // 3)
            return decode + [t // per for t in range(self.rows - MIXED_DECODE_ROWS)]
        per = self.rows // self.n
        return [t // per for t in range(self.rows)]

    def adapter_bytes(self) -> int:
        used = min(self.n, self.rows)
        return sum(
            self.ranks[s % len(self.ranks)] * (self.d_in + sum(self.outs)) * 2 for s in range(used)
        )

    def floor_bytes(self) -> int:
        return self.adapter_bytes() + self.rows * (self.d_in + 2 * sum(self.outs)) * 2


class Layer:
    """One layer of the ring: its own x, y and factor table (random factors
    written straight into the storage; ranks and scales set per slot)."""

    def __init__(self, sc: Scenario, layout: str, dev: str = "cuda") -> None:
        self.x = torch.randn(sc.rows, sc.d_in, device=dev, dtype=DT)
        self.y = torch.randn(sc.rows, sum(sc.outs), device=dev, dtype=DT)
        self.table = LoraFactorTable(sc.slots, sc.d_in, sc.outs, sc.max_rank, DT, dev, layout)
        self.table.storage.normal_(0.0, 0.02)
        ranks = torch.tensor([sc.ranks[s % len(sc.ranks)] for s in range(sc.slots)],
                             dtype=torch.int32)
        self.table.ranks.copy_(ranks.expand(len(sc.outs), sc.slots))
        self.table.scales.fill_(2.0)


# The engine's 128-row decode step with 128 Zipf(1.0) adapters (~50 live slots), per
# Llama-8B module.
DECODE_MODULES = {
    "q/k/v": Scenario("decode", 128, 50, (16,), (4096, 1024, 1024)),
    "o": Scenario("decode", 128, 50, (16,)),
    "gate/up": Scenario("decode", 128, 50, (16,), (14336, 14336)),
    "down": Scenario("decode", 128, 50, (16,), (4096,), 14336),
}
RING_WEIGHT_BYTES = 1 << 30  # base-weight rings (GEMM + LoRA benches) stream from HBM


def mixed_cases(rows: int) -> list[Scenario]:
    """The four Llama-8B modules (q/k/v, o, gate/up, down) of a mixed step of ``rows``
    rows: 104 one-row decode slots + the rest in 3 prefill runs, 53 slots, rank 16."""
    return [Scenario("mixed", rows, 53, (16,), outs, d_in) for outs, d_in in (
        ((4096, 1024, 1024), 4096), ((4096,), 4096), ((14336, 14336), 4096), ((4096,), 14336))]


def ring_size(sc: Scenario) -> int:
    return max(4, min(512, math.ceil(RING_BYTES / sc.floor_bytes())))


def build_ring(sc: Scenario, layout: str) -> list[Layer]:
    return [Layer(sc, layout) for _ in range(ring_size(sc))]


def outs_label(sc: Scenario) -> str:
    return f"{sc.d_in}->{'/'.join(map(str, sc.outs))}"


SCENARIOS = [
    Scenario(kind, rows, n, (r,))
    for r in (16, 64)
    for kind, rows, n in [
        ("decode", 64, 1), ("decode", 64, 16), ("decode", 64, 64),
        ("decode", 256, 1), ("decode", 256, 16), ("decode", 256, 64),
        ("prefill", 4096, 4), ("prefill", 4096, 32),
    ]
]  # fmt: skip
EXTRA = [
    Scenario("decode", 64, 16, (16,), (4096, 1024, 1024)),
    Scenario("decode", 64, 64, (16,), (4096, 1024, 1024)),  # engine q/k/v (Llama-8B)
    Scenario("decode", 64, 64, (16,), (14336, 14336)),  # engine gate/up
    Scenario("decode", 64, 64, (16,), (4096,), 14336),  # engine down
    # a 128-row engine decode step with 128 Zipf(1.0) adapters has ~50 live slots
    Scenario("decode", 128, 50, (16,), (4096, 1024, 1024)),
    Scenario("decode", 128, 50, (16,)),
    Scenario("decode", 128, 50, (16,), (14336, 14336)),
    Scenario("decode", 128, 50, (16,), (4096,), 14336),
    Scenario("decode", 256, 64, (64,), (4096, 1024, 1024)),
    Scenario("prefill", 4096, 32, (16,), (4096, 1024, 1024)),
    Scenario("decode", 256, 64, (8, 16, 32, 64)),
    Scenario("prefill", 4096, 32, (8, 16, 32, 64)),
    # the engine's typical mixed step (128 Zipf adapters): 600 prefill rows of 3 requests
    # + 104 decode rows over 50 slots, each Llama-8B module
    *mixed_cases(704),
    # the trace's 1,025-2,048-row mixed steps (T class 4,096's lower half): ~1,300 rows
    *mixed_cases(1344),
]
