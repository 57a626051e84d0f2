"""The TP LoRA layout reproduces the global update on real gloo ranks.

GQA q/k/v fused column-parallel projection (4 heads, 2 kv heads, head_dim 4) and the
row-parallel o projection, each rank's shard an ordinary `LoRALinear` at its local sizes
holding its local factors (`shard_lora_factors`): q/k/v A whole and B's rows in whole
heads, o A's input columns and B whole, the o shard all-reducing base + LoRA partials
(`reduce`). Four adapter slots of mixed ranks (2, 4, 8; one adapter skips k_proj, one
skips o_proj), rows of every slot plus rows with no adapter. The reference is a float64
single-process computation written here: ``x W^T + scale (x A^T) B^T`` per row.
Integer-valued factors and power-of-two scales make float32 results exact, so the
"integers" case compares with ==; the "gaussian" case within float32 rounding. The
integer case also runs on the Triton kernels (CPU interpreter), the CUDA path's backend.
Two ranks, and four (torch backend): there each of the two kv heads is held by two ranks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .dist_harness import run_world

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4
WIDTHS = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)
ROW_SLOT = [0, 1, -1, 2, 3, 1, 0, -1, 3, 2]
# slot -> (rank, scale, modules): one adapter without k_proj, one without o_proj
ADAPTERS = {0: (2, 0.5, ("q", "k", "v", "o")), 1: (8, 2.0, ("q", "v", "o")),
            2: (4, 1.0, ("q", "k", "v")), 3: (4, 0.25, ("q", "k", "v", "o"))}


def _tensor(gen: torch.Generator, shape: tuple[int, ...], integers: bool) -> torch.Tensor:
    if integers:
        return torch.randint(-2, 3, shape, generator=gen).float()
    return torch.randn(shape, generator=gen)


def make_payload(integers: bool, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    t = len(ROW_SLOT)
    adapters: dict[int, dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]]] = {}
    for slot, (r, scale, modules) in ADAPTERS.items():
        qkv = {k: (_tensor(gen, (r, HIDDEN), integers), _tensor(gen, (w, r), integers), scale)
               for k, (name, w) in enumerate(zip("qkv", WIDTHS, strict=True))
               if name in modules}
        per: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {"qkv": qkv}
        if "o" in modules:
            per["o"] = {0: (_tensor(gen, (r, WIDTHS[0]), integers),
                            _tensor(gen, (HIDDEN, r), integers), scale)}
        adapters[slot] = per
    return {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "x": _tensor(gen, (t, HIDDEN), integers),
            "x_o": _tensor(gen, (t, WIDTHS[0]), integers),
            "w_qkv": _tensor(gen, (sum(WIDTHS), HIDDEN), integers),
            "w_o": _tensor(gen, (HIDDEN, WIDTHS[0]), integers),
            "b_o": _tensor(gen, (HIDDEN,), integers),
            "row_slot": ROW_SLOT, "adapters": adapters, "num_slots": 4, "max_rank": 8}


PAYLOADS = {"integers": make_payload(True, 0), "gaussian": make_payload(False, 1)}
CASES = [("integers", "torch"), ("gaussian", "torch"), ("integers", "triton")]
CASES_4 = [("integers", "torch"), ("gaussian", "torch")]
WORLDS = {2: CASES, 4: CASES_4}
WORLD_CASES = [(n, c) for n, cases in WORLDS.items() for c in cases]
WORLD_IDS = [f"tp{n}-{'-'.join(c)}" for n, c in WORLD_CASES]


def reference(p: dict[str, Any], module: str, with_lora: bool) -> torch.Tensor:
    """float64 global output of `module` ("qkv" or "o") for every row."""
    x = (p["x"] if module == "qkv" else p["x_o"]).double()
    w = (p["w_qkv"] if module == "qkv" else p["w_o"]).double()
    y = x @ w.T
    if module == "o":
        y = y + p["b_o"].double()
    widths = WIDTHS if module == "qkv" else (HIDDEN,)
    offsets = [sum(widths[:k]) for k in range(len(widths))]
    for t, slot in enumerate(p["row_slot"]):
        if slot < 0 or not with_lora:
            continue
        for k, (a, b, scale) in p["adapters"][slot].get(module, {}).items():
            d = scale * ((x[t] @ a.double().T) @ b.double().T)
            y[t, offsets[k]:offsets[k] + widths[k]] += d
    return y


def kv_owner(j: int, n: int) -> int | None:
    """The kv head rank `j` of `n` holds alone, or None when the ranks outnumber the kv
    heads (then rank j holds head ``j // (n / KV_HEADS)``, shared)."""
    return None if n <= KV_HEADS else j // (n // KV_HEADS)


def gather_columns(local: list[torch.Tensor]) -> torch.Tensor:
    """Global q/k/v from each rank's [q_j | k_j | v_j]. Ranks sharing a kv head must hold
    the same k/v columns (checked); each head is taken once, from its first rank."""
    n = len(local)
    kv_local = max(WIDTHS[1] // n, HEAD_DIM)
    per_rank = [torch.split(y, [WIDTHS[0] // n, kv_local, kv_local], dim=1) for y in local]
    q = torch.cat([r[0] for r in per_rank], 1)
    if n <= KV_HEADS:
        kv = [torch.cat([r[k] for r in per_rank], 1) for k in (1, 2)]
    else:
        first = {}
        for j in range(n):
            head = kv_owner(j, n)
            assert head is not None
            if head in first:  # a replica: exactly the first holder's columns
                for k in (1, 2):
                    assert torch.equal(per_rank[j][k], per_rank[first[head]][k])
            else:
                first[head] = j
        kv = [torch.cat([per_rank[first[h]][k] for h in range(KV_HEADS)], 1) for k in (1, 2)]
    return torch.cat([q, *kv], 1)


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict[Any, Any]]]:
    return {n: run_world("tests.parallel.scenarios_shards:run",
                         {"payloads": PAYLOADS, "cases": cases}, world_size=n,
                         timeout_s=240.0)
            for n, cases in WORLDS.items()}


def check(got: torch.Tensor, want: torch.Tensor, case: tuple[str, str]) -> None:
    if case[0] == "integers":
        assert torch.equal(got.double(), want)
    else:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("n", "case"), WORLD_CASES, ids=WORLD_IDS)
@pytest.mark.parametrize("label", ["lora", "base"])
def test_column_parallel_qkv_matches_global(worlds: dict[int, list[dict[Any, Any]]], n: int,
                                            case: tuple[str, str], label: str) -> None:
    got = gather_columns([worlds[n][j][case][f"qkv_{label}"] for j in range(n)])
    check(got, reference(PAYLOADS[case[0]], "qkv", label == "lora"), case)


@pytest.mark.parametrize(("n", "case"), WORLD_CASES, ids=WORLD_IDS)
@pytest.mark.parametrize("label", ["lora", "base"])
def test_row_parallel_o_matches_global_on_every_rank(worlds: dict[int, list[dict[Any, Any]]],
                                                     n: int, case: tuple[str, str],
                                                     label: str) -> None:
    want = reference(PAYLOADS[case[0]], "o", label == "lora")
    for j in range(n):
        check(worlds[n][j][case][f"o_{label}"], want, case)


@pytest.mark.parametrize(("n", "case"), WORLD_CASES, ids=WORLD_IDS)
def test_rows_without_adapter_get_exactly_zero_delta(worlds: dict[int, list[dict[Any, Any]]],
                                                     n: int, case: tuple[str, str]) -> None:
    rows = [t for t, s in enumerate(ROW_SLOT) if s < 0]
    adapted = [t for t, s in enumerate(ROW_SLOT) if s >= 0]
    res = [worlds[n][j][case] for j in range(n)]
    with_lora = gather_columns([r["qkv_lora"] for r in res])
    base = gather_columns([r["qkv_base"] for r in res])
    assert torch.equal(with_lora[rows], base[rows])
    for r in res:
        assert torch.equal(r["o_lora"][rows], r["o_base"][rows])
    # and every adapted row does change (the checks above cannot pass vacuously)
    assert all(not torch.equal(with_lora[t], base[t]) for t in adapted)
    o_adapted = [t for t in adapted if "o" in ADAPTERS[ROW_SLOT[t]][2]]
    assert all(not torch.equal(res[0]["o_lora"][t], res[0]["o_base"][t]) for t in o_adapted)


@pytest.mark.parametrize(("n", "case"), WORLD_CASES, ids=WORLD_IDS)
def test_lora_adds_no_collective_and_o_one_base_all_reduce(
        worlds: dict[int, list[dict[Any, Any]]], n: int, case: tuple[str, str]) -> None:
    t = len(ROW_SLOT)
    for j in range(n):
        r = worlds[n][j][case]
        assert r["qkv_lora_counts"] == r["qkv_base_counts"]
        assert r["qkv_lora_counts"]["calls"] == 0  # a column shard sends nothing
        assert r["o_lora_counts"] == r["o_base_counts"]
        assert r["o_lora_counts"]["calls"] == r["o_lora_counts"]["base_all_reduce"] == 1
        assert r["o_lora_counts"]["lora_calls"] == 0
        assert r["o_lora_counts"]["lora_ring_bytes"] == 0
        # the one all-reduce carries the float32 [T, hidden] output, nothing more
        assert r["o_lora_counts"]["base_payload_bytes"] == t * HIDDEN * 4
        assert r["o_lora_counts"]["base_ring_bytes"] * n == 2 * (n - 1) * t * HIDDEN * 4


@pytest.mark.parametrize("n", sorted(WORLDS))
def test_residency_ledger(worlds: dict[int, list[dict[Any, Any]]], n: int) -> None:
    """Column: A whole + B's rows (B/N, one whole head where kv heads are shared);
    row: A/N + B whole."""
    want = 0
    for r, _scale, modules in ADAPTERS.values():
        for k, m in enumerate("qkv"):
            if m in modules:
                rows = WIDTHS[k] // n if k == 0 else max(WIDTHS[k] // n, HEAD_DIM)
                want += r * HIDDEN + rows * r
        want += r * WIDTHS[0] // n + HIDDEN * r if "o" in modules else 0
    for j in range(n):
        for case in WORLDS[n]:
            assert worlds[n][j][case]["resident_scalars"] == want
