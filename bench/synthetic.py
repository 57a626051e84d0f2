"""Synthetic models, adapters and workloads shared by the engine benchmarks.

* shapes: `LLAMA3_8B` (Llama-3-8B, llama3 RoPE) and `TINY_SHAPE` (the same code path at toy
  size, for CPU smoke runs); `random_base` builds a random-weight `BaseModel` for
  `build_engine`, `write_checkpoint` a model directory of one (tensor-parallel ranks load
  their shard from a directory);
* adapters: `random_adapter` (rank-r all-linear factors from a seed), `adapters_for`
  (N adapters over 16 distinct contents, a digest each), `pool_pages` (the unified pool's
  page count for KV blocks plus those adapters: one page = one KV block);
* workloads: `make_trace` (S-LoRA-style: Zipf(1.0) adapters, Poisson arrivals, uniform
  prompt and output lengths), `rotated`, and `start_decoding` / `step_intervals` (a batch
  of requests all decoding, and the intervals between `engine.step()` returns).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dataplane.core import SamplingParams
from dataplane.engine import BaseModel, Engine
from dataplane.engine.adapters import LoadedAdapter, ModuleFactors
from dataplane.engine.builder import DTYPES
from dataplane.models import LlamaForCausalLM, ModelConfig, init_random
from dataplane.pool.packing import factor_shapes, factors_from_modules
from dataplane.pool.page_demand import plan_rows
from dataplane.pool.unified import unified_layout

LLAMA3_8B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY_SHAPE: dict[str, Any] = {
    **LLAMA3_8B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""`--shape tiny`: the same code path at toy size (smoke runs of the random-weights mode)."""
SHAPES = {"llama3-8b": LLAMA3_8B, "tiny": TINY_SHAPE}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK_SIZE = 16


def random_base(shape: dict[str, Any], dtype: torch.dtype, device: str, seed: int = 0,
                tag: str = "random-llama3-8b-shape") -> BaseModel:
    """A random-weight base (`init_random(seed)`) under a digest named by `tag` and `seed`."""
    config = ModelConfig.from_dict(dict(shape))
    model = init_random(LlamaForCausalLM(config, dtype, torch.device(device)), seed=seed)
    return BaseModel(model, hashlib.sha256(f"{tag}-seed{seed}".encode()).hexdigest())


_HF_NAMES = {"qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")),
             "o_proj": ("self_attn", ("o_proj",)),
             "gate_up_proj": ("mlp", ("gate_proj", "up_proj")),
             "down_proj": ("mlp", ("down_proj",))}


def write_checkpoint(model: LlamaForCausalLM, shape: dict[str, Any], dest: Path) -> Path:
    """`model` as a Hugging Face model directory (config.json + model.safetensors, the
    fused projections split back into q/k/v and gate/up), for `build_engine` to load."""
    from safetensors.torch import save_file

    tensors = {"model.embed_tokens.weight": model.embed_tokens.weight,
               "model.norm.weight": model.norm.weight}
    if not model.config.tie_word_embeddings:
        tensors["lm_head.weight"] = model.lm_head_weight
    for i, layer in enumerate(model.layers):
        prefix = f"model.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{prefix}.{norm}.weight"] = getattr(layer, norm).weight
        for attr, (parent, names) in _HF_NAMES.items():
            linear = getattr(layer, attr)
            for name in names:
                start, end = linear.slice_rows(name)
                tensors[f"{prefix}.{parent}.{name}.weight"] = linear.weight[start:end]
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
              str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], **shape,
         "torch_dtype": str(model.dtype).removeprefix("torch.")}, indent=1))
    return dest


def random_adapter(config: ModelConfig, rank: int, seed: int, device: str,
                   dtype: torch.dtype) -> LoadedAdapter:
    """Rank-`rank` factors on every linear projection of every layer, from `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    modules = []
    for layer in range(config.num_layers):
        for name in ALL_LINEAR:
            d_out, d_in = config.module_shapes[name]
            a = torch.randn(rank, d_in, generator=gen, device=device) / math.sqrt(d_in)
            b = torch.randn(d_out, rank, generator=gen, device=device) * 0.01
            modules.append(ModuleFactors(layer, name, a.to(dtype), b.to(dtype), 2.0))
    digest = hashlib.sha256(f"random-adapter-{seed}-{rank}".encode()).hexdigest()
    return LoadedAdapter(tuple(modules), digest, f"random:{seed}")


def adapters_for(config: ModelConfig, n: int, dtype: torch.dtype, tag: str
                 ) -> list[LoadedAdapter]:
    """`n` rank-16 adapters made on the host: 16 distinct random contents (seeds 0..15, as
    `random_adapter`), each adapter under its own digest (`tag`, index)."""
    contents = [random_adapter(config, 16, i, "cpu", dtype) for i in range(min(n, 16))]
    return [LoadedAdapter(contents[i % 16].modules,
                          hashlib.sha256(f"{tag}-{i}".encode()).hexdigest(), f"random:{i}")
            for i in range(n)]


def pool_pages(model: LlamaForCausalLM, adapters: list[LoadedAdapter], kv_blocks: int,
               block_size: int = BLOCK_SIZE) -> int:
    """Pages of an engine's unified pool that holds `kv_blocks` KV blocks besides
    `adapters` (pinned, each in pages of its own): `EngineConfig.num_kv_blocks`."""
    cfg = model.config
    geometry = unified_layout(
        1, num_layers=cfg.num_layers, block_size=block_size, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, widest_row=max(max(s) for s in cfg.module_shapes.values()),
        elem_bytes=model.dtype.itemsize).geometry
    pages: dict[tuple[Any, ...], int] = {}
    total = kv_blocks
    for adapter in adapters:
        shapes = factor_shapes(factors_from_modules(adapter.modules))
        key = tuple(sorted((s.key, s.rank, s.d_in, s.d_out) for s in shapes))
        if key not in pages:
            pages[key] = plan_rows(shapes, geometry).num_pages
        total += pages[key]
    return total


@dataclass(frozen=True)
class Request:
    arrival: float
    prompt: list[int]
    max_tokens: int
    adapter: int | None


def add_serving_args(p: argparse.ArgumentParser, kv_help: str | None = None) -> None:
    """The serving benchmarks' shared flags: model shape, device and dtype, request
    lengths and the engine's budgets (tiny CPU defaults)."""
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--prompt-min", type=int, default=16)
    p.add_argument("--prompt-max", type=int, default=64)
    p.add_argument("--output-min", type=int, default=8)
    p.add_argument("--output-max", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--kv-blocks", type=int, default=512, help=kv_help)
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")


def make_trace(args: argparse.Namespace, vocab: int, n_adapters: int) -> list[Request]:
    """`--requests` requests: Poisson arrivals at `--rate` (inf: all at t = 0), prompt and
    output lengths uniform in their `--prompt-*` / `--output-*` ranges, adapter drawn from
    `--popularity` over `n_adapters` (None without): Zipf(1.0) (adapter i's weight
    1 / (i + 1); the default) or uniform."""
    gen = torch.Generator().manual_seed(args.seed)
    # Adapters drawn from their own stream: every N gets the same arrivals and prompts.
    pick = torch.Generator().manual_seed(args.seed + 1)
    uniform = getattr(args, "popularity", "zipf") == "uniform"
    weights = torch.tensor([1.0 if uniform else 1.0 / (i + 1)
                            for i in range(max(n_adapters, 1))])
    t, out = 0.0, []
    for _ in range(args.requests):
        if math.isfinite(args.rate):
            t += float(torch.empty(1).exponential_(args.rate, generator=gen))
        plen = int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,), generator=gen))
        olen = int(torch.randint(args.output_min, args.output_max + 1, (1,), generator=gen))
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        adapter = int(torch.multinomial(weights, 1, generator=pick)) if n_adapters else None
        out.append(Request(t, prompt, olen, adapter))
    return out


def rotated(trace: list[Request], by: int) -> list[Request]:
    """The trace with every prompt rotated left by ``by`` tokens: same lengths, adapters and
    arrivals, and (for ``by`` > 0) no full block in common with the unrotated prompts."""
    return [replace(r, prompt=r.prompt[by:] + r.prompt[:by]) for r in trace]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def start_decoding(engine: Engine, args: argparse.Namespace, vocab: int, batch: int, ctx: int,
                   handles: list[Any]) -> None:
    """`batch` requests of `ctx` random prompt tokens (request i on adapter i % N), stepped
    until every one is past its prefill."""
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(batch):
        engine.add_request(f"d{i}", torch.randint(3, vocab, (ctx,), generator=gen).tolist(),
                           SamplingParams(temperature=0.0, max_tokens=args.steps + 16,
                                          ignore_eos=True),
                           handles[i % len(handles)] if handles else None)
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()


def step_intervals(engine: Engine, steps: int, device: str, warm_up: int = 3) -> list[float]:
    """Seconds between consecutive `engine.step()` returns over `steps` steps, after
    `warm_up` untimed ones and a device sync (an async engine keeps a step in flight)."""
    for _ in range(warm_up):
        engine.step()
    times = []
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def save_results(out: str | None, name: str, args: argparse.Namespace, results: object) -> None:
    """Write ``{"args", "results"}`` as JSON to ``out/name`` (nothing when `out` is None)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(
            json.dumps({"args": vars(args), "results": results}, indent=2, default=str))
