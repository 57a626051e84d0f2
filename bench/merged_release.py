"""Merged releases: what the merge job costs, and what serving the release buys.

`merge`: a random-weights base checkpoint (default the Llama-3-8B shape, bf16) and one
rank-16 adapter on every linear projection are written once under `--workdir`; then the
merge job's own code runs in a child process each — `merge_checkpoint` (streamed, sharded,
float32 deltas, one rounding) and, with `--gate`, the exactness gate (HF, float32, one
model at a time) — timed by wall clock, with the child's peak resident memory
(`ru_maxrss`, which counts the source file's mmap'd pages) and the merge's peak anonymous
memory (what it allocates).

`serve`: three engines on `--device`, each from its checkpoint on disk: the plain base,
the merged release, and the plain base serving the same adapter live (one LoRA slot, every
request on it). The same trace (bench/trace.py's driver) runs on each in `--rounds`
rotated rounds, arms in rotating order; then decode steps at `--decode-batch` requests of
`--decode-ctx` tokens. Reported: output tok/s per arm and round, and the median ratios
merged / base and live / base (the release is served as a base: its target is 1.0).

    python bench/merged_release.py merge --shape llama3-8b --gate --out OUT
    python bench/merged_release.py merge --shape llama3-8b --init-device host   # < 32 GiB RAM
    python bench/merged_release.py serve --shape llama3-8b --device cuda --rounds 3 --out OUT
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.synthetic import (
    ALL_LINEAR,
    SHAPES,
    make_trace,
    random_base,
    rotated,
    save_results,
    start_decoding,
    step_intervals,
    write_checkpoint,
)
from bench.trace_run import run_engine

RANK = 16
ALPHA = 32
MERGE_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def write_adapter(config: dict[str, Any], dest: Path, dtype: torch.dtype, seed: int = 7,
                  rank: int = RANK, targets: tuple[str, ...] = ALL_LINEAR) -> Path:
    """A PEFT LoRA directory: rank `rank` (alpha 2 x rank) on `targets` of every layer,
    random factors from `seed` (B scaled so the delta is a small fraction of W)."""
    from safetensors.torch import save_file

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
              "o_proj": (hidden, hidden), "gate_proj": (inter, hidden),
              "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    parents = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
               "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name in targets:
            d_out, d_in = shapes[name]
            prefix = f"base_model.model.model.layers.{layer}.{parents[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, d_in, generator=gen) / math.sqrt(d_in)).to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(d_out, rank, generator=gen) * 0.01).to(dtype)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    (dest / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none",
        "use_rslora": False, "base_model_name_or_path": None}, indent=1))
    return dest


def write_sharded_random(shape: dict[str, Any], dtype: torch.dtype, dest: Path,
                         seed: int = 0, device: str = "cpu") -> Path:
    """A random-weights HF checkpoint written one layer per shard (with its index), drawn
    tensor by tensor on `device` and moved to the host: memory stays at one layer (or the
    embedding), so an 8B-shaped base can be made on a machine with less memory than the
    model (on a GPU, the draws take no time)."""
    from safetensors.torch import save_file

    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    head_dim = hidden // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head_dim
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*size: int) -> torch.Tensor:
        drawn = torch.randn(*size, generator=gen, device=device) * 0.02
        return drawn.to(dtype).cpu()

    shards: list[dict[str, torch.Tensor]] = [
        {"model.embed_tokens.weight": normal(shape["vocab_size"], hidden)},
        {"lm_head.weight": normal(shape["vocab_size"], hidden),
         "model.norm.weight": torch.ones(hidden, dtype=dtype)}]
    dest.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    count = shape["num_hidden_layers"] + 2

    def write(index: int, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total
        name = f"model-{index + 1:05d}-of-{count:05d}.safetensors"
        save_file(tensors, str(dest / name), metadata={"format": "pt"})
        for key, tensor in tensors.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()

    for i, tensors in enumerate(shards):
        write(i, tensors)
    del shards
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        write(layer + 2, {
            f"{p}.self_attn.q_proj.weight": normal(hidden, hidden),
            f"{p}.self_attn.k_proj.weight": normal(kv, hidden),
            f"{p}.self_attn.v_proj.weight": normal(kv, hidden),
            f"{p}.self_attn.o_proj.weight": normal(hidden, hidden),
            f"{p}.mlp.gate_proj.weight": normal(inter, hidden),
            f"{p}.mlp.up_proj.weight": normal(inter, hidden),
            f"{p}.mlp.down_proj.weight": normal(hidden, inter),
            f"{p}.input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            f"{p}.post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype)})
    (dest / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (dest / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], **shape,
         "torch_dtype": str(dtype).removeprefix("torch.")}, indent=1))
    return dest


def prepare(args: argparse.Namespace) -> tuple[Path, Path]:
    """The base checkpoint and the adapter under `--workdir` (written once): drawn on
    `--init-device` and written as one file, or with `--init-device host` layer by layer
    (`write_sharded_random`)."""
    work = Path(args.workdir)
    base_dir, adapter_dir = work / f"base-{args.shape}", work / f"adapter-{args.shape}"
    shape = SHAPES[args.shape]
    dtype = getattr(torch, args.dtype)
    if not (base_dir / "config.json").is_file():
        t0 = time.perf_counter()
        if args.init_device == "host":
            write_sharded_random(dict(shape), dtype, base_dir)
        else:
            base = random_base(shape, dtype, args.init_device)
            write_checkpoint(base.model, shape, base_dir)
            del base
        print(f"# base checkpoint written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if not (adapter_dir / "adapter_config.json").is_file():
        write_adapter(dict(shape), adapter_dir, dtype)
    return base_dir, adapter_dir


def _merge_child(base_dir: str, adapter_dir: str, dtype: str, out_dir: str, gate: bool,
                 queue: Any) -> None:
    from controlplane.merges.compute import load_merge_adapter, merge_checkpoint
    from controlplane.merges.gate import exactness_gate
    from controlplane.merges.thresholds import THRESHOLDS
    from dataplane.artifacts import ArtifactLimits, read_base_abi, validate_peft_dir

    base = read_base_abi(Path(base_dir))
    h_artifact = validate_peft_dir(Path(adapter_dir), base,
                                   ArtifactLimits(max_rank=RANK)).h_artifact
    adapter = load_merge_adapter(Path(adapter_dir), base, Fraction(1),
                                 expected_h_artifact=h_artifact, max_rank=RANK)
    t0 = time.perf_counter()
    with AnonPeak() as anon:
        merged = merge_checkpoint(Path(base_dir), base, [adapter], dtype, Path(out_dir))
    row: dict[str, Any] = {"merge_s": time.perf_counter() - t0, "files": len(merged.files),
                           "tensors": len(merged.tensors),
                           "merge_peak_rss_gib": _peak_rss_gib(),
                           "merge_peak_anon_gib": anon.peak_gib}
    if gate:
        t0 = time.perf_counter()
        result = exactness_gate(Path(base_dir), Path(out_dir), [adapter], base.vocab_size,
                                THRESHOLDS[dtype])
        row.update(gate_s=time.perf_counter() - t0, gate_passed=result.passed,
                   gate_max_relative_error=result.max_relative_error,
                   peak_rss_gib=_peak_rss_gib())
    queue.put(row)


class AnonPeak:
    """The process's peak anonymous resident memory (`RssAnon` of /proc/self/status,
    sampled every 20 ms) while the block runs: heap and tensors, not the pages of files
    read through mmap (which `ru_maxrss` also counts, and the kernel can drop)."""

    def __init__(self) -> None:
        self.peak_gib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak_gib = max(self.peak_gib, int(line.split()[1]) / 2**20)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def merge_main(args: argparse.Namespace) -> list[dict[str, Any]]:
    base_dir, adapter_dir = prepare(args)
    out_dir = Path(args.workdir) / f"merged-{args.shape}"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_merge_child, args=(str(base_dir), str(adapter_dir),
                                                   MERGE_DTYPES[args.dtype], str(out_dir),
                                                   args.gate, queue))
    child.start()
    row = queue.get()
    child.join()
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    row.update(shape=args.shape, dtype=args.dtype, checkpoint_gib=size / 2**30,
               threads=torch.get_num_threads())
    print(json.dumps(row), flush=True)
    return [row]


def serve_main(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.trace import base_arm, lora_arm
    from dataplane.engine import load_base
    from dataplane.engine.adapters import load_peft_adapter

    base_dir, adapter_dir = prepare(args)
    merged_dir = Path(args.workdir) / f"merged-{args.shape}"
    if not (merged_dir / "config.json").is_file():
        merge_main(argparse.Namespace(**{**vars(args), "gate": False}))
    dev = args.device
    max_len = args.prompt_max + args.output_max + 16
    plain = load_base(base_dir, args.dtype, dev)
    assert plain.abi is not None
    adapter = load_peft_adapter(adapter_dir, plain.abi, RANK)
    live, handles = lora_arm(args, load_base(base_dir, args.dtype, dev), [adapter], max_len)
    arms = {"base": (base_arm(args, plain, max_len), []),
            "merged": (base_arm(args, load_base(merged_dir, args.dtype, dev), max_len), []),
            "live": (live, handles)}
    vocab = plain.model.config.vocab_size
    trace = make_trace(args, vocab, 1)  # one adapter: every request names it
    results: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {"merged": [], "live": []}
    names = list(arms)
    for i in range(args.rounds):
        order = names[i % 3:] + names[: i % 3]
        got = {}
        for name in order:
            engine, hs = arms[name]
            got[name] = {**run_engine(name, engine, rotated(trace, i), hs, dev), "round": i,
                         "kind": "trace"}
        results += [got[n] for n in names]
        for name in ratios:
            ratios[name].append(got[name]["output_tok_s"] / got["base"]["output_tok_s"])
        print(f"# round {i} ({' '.join(order)}): merged/base "
              f"{ratios['merged'][-1]:.3f}, live/base {ratios['live'][-1]:.3f}",
              file=sys.stderr, flush=True)
    decode = {}
    for name, (engine, hs) in arms.items():
        start_decoding(engine, args, vocab, args.decode_batch, args.decode_ctx, hs)
        times = step_intervals(engine, args.steps, dev)
        decode[name] = args.decode_batch / statistics.median(times)
        results.append({"system": name, "kind": "decode", "batch": args.decode_batch,
                        "ctx": args.decode_ctx, "step_ms_p50": 1e3 * statistics.median(times),
                        "output_tok_s": decode[name]})
    summary = {"kind": "summary",
               "trace_merged_over_base": statistics.median(ratios["merged"]),
               "trace_live_over_base": statistics.median(ratios["live"]),
               "decode_merged_over_base": decode["merged"] / decode["base"],
               "decode_live_over_base": decode["live"] / decode["base"]}
    print(json.dumps(summary), flush=True)
    return [*results, summary]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["merge", "serve"])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--dtype", choices=sorted(MERGE_DTYPES), default="bfloat16")
    p.add_argument("--workdir", default="/tmp/adapterplane-bench-merge")
    p.add_argument("--init-device", default="cpu",
                   help="where the random base is drawn (cpu, cuda), or host: layer by layer")
    p.add_argument("--gate", action="store_true", help="merge: run the exactness gate too")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--rate", type=float, default=math.inf)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-min", type=int, default=64)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--output-min", type=int, default=64)
    p.add_argument("--output-max", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-batched-tokens", type=int, default=4096)
    p.add_argument("--kv-blocks", type=int, default=4096)
    p.add_argument("--decode-batch", type=int, default=64)
    p.add_argument("--decode-ctx", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.piecewise, args.policy, args.fold = True, "fcfs", "auto"
    rows = merge_main(args) if args.mode == "merge" else serve_main(args)
    save_results(args.out, f"{args.mode}.json", args, rows)


if __name__ == "__main__":
    main()
