"""Decode step with Compress-then-Serve members served natively vs as materialised LoRAs.

One engine per case, Llama-3-8B shape (random bf16 weights), `--batch` requests decoding at
context ≈ `--context`, request i on member i % N (so min(N, batch) distinct members per
step), decode steps replayed from CUDA graphs; the time of a step is the interval between
consecutive `engine.step()` returns (bench/synthetic.py `step_intervals`). A synthetic
collection: `--clusters` random bases (U, V) of shared rank `--rank` per all-linear module,
a random R×R core per member. Cases:

* `none`: the base model, no LoRA slots.
* `native`: `engine.load_collection` — each cluster's bases resident once, a core per
  member slot, the three-stage operator in every projection; `max_rank=0`: the engine
  holds no LoRA factor tables and launches no LoRA kernels.
* `native+lora`: the same in an engine that also has rank-R LoRA tables (it could serve
  ordinary adapters beside the members, so its graphs launch the LoRA kernels too).
* `lora`: the same members materialised (`B = U Σ_i`, `A = Vᵀ`, scale 1) and registered as
  ordinary rank-R LoRAs (what `adapterctl collections member` serves), pinned in the
  engine's unified pool (`--kv-blocks` KV blocks plus their pages).

Resident bytes are the members' own state: for `native` the collection tables (bases of
every block, a float32 core per slot and module), for `lora` N × the rank-R factors.

    python3 bench/collection_serving.py --members 16 64 128 --out $OUT/collserve
    python3 bench/collection_serving.py --shape tiny --device cpu --members 2 --batch 4 \
        --context 16 --steps 3 --rank 4 --out /tmp/cs          # smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import pool_pages, start_decoding, step_intervals, sync
from bench.tp import DTYPES, SHAPES
from dataplane.collections.bundle import CollectionBundle, build_bundle
from dataplane.collections.collection_fit import CollectionFit
from dataplane.collections.joint_fit import JD_FULL
from dataplane.engine import BaseModel, EngineConfig, EngineSpec, build_engine
from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.models import LlamaForCausalLM, ModelConfig, init_random

DIGEST = hashlib.sha256(b"bench-collection-serving-random-base").hexdigest()
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
          "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def module_names(config: ModelConfig) -> list[str]:
    return [f"model.layers.{layer}.{PARENT[m]}.{m}" for layer in range(config.num_layers)
            for m in MODULES]


def synthetic_bundle(config: ModelConfig, members: int, clusters: int, rank: int
                     ) -> CollectionBundle:
    """Random bases per cluster and cores per member (float32, host memory)."""
    device = "cpu"
    gen = torch.Generator(device=device).manual_seed(7)
    names = module_names(config)
    shapes = {n: config.module_shapes[n.rsplit(".", 1)[1]] for n in names}
    bases = tuple({n: (torch.randn(d_out, rank, generator=gen, device=device) * 0.01,
                       torch.randn(d_in, rank, generator=gen, device=device) / math.sqrt(d_in))
                   for n, (d_out, d_in) in shapes.items()} for _ in range(clusters))
    cores = tuple({n: torch.randn(rank, rank, generator=gen, device=device) / math.sqrt(rank)
                   for n in names} for _ in range(members))
    zeros = tuple({n: 0.0 for n in names} for _ in range(members))
    fit = CollectionFit(JD_FULL, rank, tuple(names),
                        tuple(i % clusters for i in range(members)), bases, cores, zeros,
                        zeros, 0)
    sources = [hashlib.sha256(f"bench-member-{i}".encode()).hexdigest() for i in range(members)]
    return build_bundle(fit, h_base=DIGEST, sources=sources, settings={"bench": 1})


def materialised(bundle: CollectionBundle, index: int, dtype: torch.dtype, device: str
                 ) -> LoadedAdapter:
    """Member `index` as a rank-R LoRA, `B = U Σ_i` and `A = Vᵀ` formed on `device`."""
    modules = []
    for name in bundle.modules:
        layer, module = int(name.split(".")[2]), name.rsplit(".", 1)[1]
        u, v = bundle.bases(bundle.assignment[index], name)
        b = u.to(device) @ bundle.core(index, name).to(device)
        modules.append(ModuleFactors(layer, module, v.to(device).T.to(dtype).contiguous(),
                                     b.to(dtype), 1.0))
    digest = hashlib.sha256(f"bench-materialised-{index}".encode()).hexdigest()
    return LoadedAdapter(tuple(modules), digest, f"member:{index}")


def run_case(model: LlamaForCausalLM, args: argparse.Namespace, mode: str, members: int,
             bundle: CollectionBundle | None) -> dict[str, Any]:
    config, dtype = model.config, model.dtype
    native = mode.startswith("native")
    loras = ([materialised(bundle, i, dtype, "cpu") for i in range(members)]
             if mode == "lora" and bundle is not None else [])
    cfg = EngineConfig(max_num_seqs=args.batch, max_num_batched_tokens=max(args.batch, 2048),
                       num_kv_blocks=pool_pages(model, loras, args.kv_blocks), block_size=16,
                       max_slots=0 if mode == "none" else members,
                       max_rank=0 if mode == "native" else args.rank,
                       max_model_len=args.context + args.steps + 32,
                       enable_cuda_graphs=args.device == "cuda",
                       collection_blocks=args.clusters if native else 0,
                       collection_rank=args.rank)
    engine = build_engine(EngineSpec(BaseModel(model, DIGEST), cfg, lora_fold="off"))
    elem = torch.finfo(dtype).bits // 8
    per_module = sum(d_in + d_out for d_out, d_in in config.module_shapes.values())
    handles: list[Any] = []
    resident = 0
    if native:
        assert bundle is not None
        handles = list(engine.load_collection(bundle).members)
        resident = sum(t.nbytes for t in engine.runner.collections.values())
    elif mode == "lora":
        handles = [engine.register_loaded_adapter(a) for a in loras]
        resident = members * args.rank * per_module * config.num_layers * elem
    start_decoding(engine, args, config.vocab_size, args.batch, args.context, handles)
    times = step_intervals(engine, args.steps, args.device)
    sync(args.device)
    step = statistics.median(times)
    row = {"mode": mode, "members": members, "clusters": args.clusters, "rank": args.rank,
           "distinct_per_step": min(members, args.batch) if mode != "none" else 0,
           "step_ms": 1e3 * step, "tokens_per_s": args.batch / step,
           "resident_mb": resident / 2**20}
    print(json.dumps(row), flush=True)
    del engine, handles, loras
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    base = next(r["step_ms"] for r in rows if r["mode"] == "none")
    out = ["| members | distinct / step | mode | decode ms/step | keep vs no LoRA | "
           "members' resident MB |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['members']} | {r['distinct_per_step']} | {r['mode']} | "
                   f"{r['step_ms']:.2f} | {base / r['step_ms']:.2f} | "
                   f"{r['resident_mb']:.0f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--members", type=int, nargs="+", default=[16, 64, 128])
    p.add_argument("--clusters", type=int, default=1)
    p.add_argument("--rank", type=int, default=32, help="shared rank R")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kv-blocks", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    config = ModelConfig.from_dict(dict(SHAPES[args.shape]))
    model = init_random(LlamaForCausalLM(config, DTYPES[args.dtype], torch.device(args.device)),
                        seed=0)
    rows = [run_case(model, args, "none", 0, None)]
    for n in args.members:
        bundle = synthetic_bundle(config, n, args.clusters, args.rank)
        for mode in ("native", "native+lora", "lora"):
            rows.append(run_case(model, args, mode, n, bundle))
        del bundle
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "collection_serving.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (args.out / "collection_serving.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
