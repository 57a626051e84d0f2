"""The agent over HTTP against its own engine driven directly: one workload, one device.

    python -m bench.http_vs_engine --shape llama3-8b --device cuda --dtype bfloat16 \
        --adapters 128 --concurrency 256 --num-requests 1024 --out-dir OUT
    python -m bench.http_vs_engine --shape tiny --adapters 4 --concurrency 8 \
        --num-requests 16 --input-len 32 --output-len 16          # CPU smoke run

1. Assets (cached in `--workdir`): a random-weights base of `--shape` drawn layer by layer
   on the host (`bench.merged_release.write_sharded_random`) with the tokenizer files of
   `--tokenizer-dir` (the vocabulary is the tokenizer's, so the agent detokenizes real
   text as it streams); `--adapters` PEFT adapters of rank `--rank` on `--targets`. The
   embedded control plane (SQLite, file://) starts, and a child process registers the
   base and pushes, validates and publishes the adapters as `bench/a-<i>` while the
   engine arm loads; the engine's timed runs wait for it to finish (nothing else runs on
   the host while either arm is timed).
2. `engine`: in this process, the engine exactly as the agent builds it
   (`agent.engine_factory.engine_spec` of the same `AgentSettings` the agent gets), the
   adapters registered, the workload bench/serving.py generates (bench/serving_workload:
   same seed, same prompts, request i on adapter i's alias), fed to `engine.step()` with
   at most `--concurrency` requests in flight; then the same requests again with Poisson
   arrivals at `--load-fraction` of the request rate just measured. Times are taken as
   the HTTP client takes them: from a request's arrival (or the freeing of its
   concurrency slot), so the wait for the next step boundary counts, to when its tokens
   are back on the host.
3. `http`: one agent process with the same settings on that control plane, every alias
   warmed once; then bench/serving.py against it with the same two workloads (the
   Poisson one at the engine's rate, so both see the same load).

Reported: output tok/s, TTFT / TPOT / ITL percentiles of each run, http / engine output
throughput at max concurrency and http / engine TTFT p99 under the Poisson load, and how
many requests' greedy tokens agree between the two. `<out-dir>/summary.json` is rewritten
after every run, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.config import AgentSettings
from agent.engine_factory import engine_spec
from agent.supervisor import AgentProcess
from bench import gil_profile, serving
from bench.merged_release import write_adapter, write_sharded_random
from bench.serving_cpu import publish_adapters
from bench.serving_metrics import RequestResult, summarize, table
from bench.serving_workload import WorkloadRequest, WorkloadSpec, make_workload
from bench.synthetic import BLOCK_SIZE, SHAPES
from dataplane.core import SamplingParams

NAMESPACE = "bench"
BASE_NAME = "random-base"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/adapterplane-http-vs-engine"))
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/http-vs-engine"))
    p.add_argument("--tokenizer-dir", type=Path, default=None,
                   help="tokenizer files for the base (default: SmolLM2's, prepared locally)")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--poisson-requests", type=int, default=0, help="0: --num-requests")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--load-fraction", type=float, default=0.8)
    p.add_argument("--poisson-rate", type=float, default=None,
                   help="req/s of the HTTP arm's Poisson run when the engine arm does not run "
                   "in this process (default: --load-fraction of the HTTP arm's own peak)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default="engine,http")
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--max-batched-tokens", type=int, default=None)
    p.add_argument("--agent-start-timeout", type=float, default=900.0)
    p.add_argument("--also-no-stream", action="store_true",
                   help="run the max-concurrency workload once more with whole answers")
    p.add_argument("--profile-agent", type=float, default=0.0, metavar="SECONDS",
                   help="sample the agent's GIL holder with py-spy (if on PATH) for this "
                   "long during the streamed max-concurrency run: <out-dir>/agent-gil.prof, "
                   "summarized in summary.json's agent_gil (bench/gil_profile.py)")
    return p.parse_args(argv)


# ---- assets ------------------------------------------------------------------------------

def tokenizer_dir(args: argparse.Namespace) -> Path:
    if args.tokenizer_dir is not None:
        return Path(args.tokenizer_dir)
    from dataplane.assets import prepare_smollm2

    return prepare_smollm2(args.workdir / "smollm2")


def vocab_size(tok_dir: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tok_dir))


def make_base(args: argparse.Namespace) -> Path:
    tok = tokenizer_dir(args)
    dest = args.workdir / f"base-{args.shape}-{args.dtype}"
    if not (dest / "config.json").is_file():
        shape = {**SHAPES[args.shape], "vocab_size": vocab_size(tok)}
        started = time.perf_counter()
        write_sharded_random(shape, getattr(torch, args.dtype), dest, device=args.device)
        print(f"# base written in {time.perf_counter() - started:.1f} s", flush=True)
    for name in TOKENIZER_FILES:
        if (tok / name).is_file():
            shutil.copy(tok / name, dest / name)
    return dest


def make_adapters(args: argparse.Namespace, base: Path) -> list[Path]:
    config = json.loads((base / "config.json").read_text())
    targets = args.targets.split(",")
    dirs = []
    for i in range(args.adapters):
        dest = args.workdir / f"adapter-{args.shape}-r{args.rank}-{'-'.join(targets)}-{i}"
        if not (dest / "adapter_config.json").is_file():
            write_adapter(config, dest, getattr(torch, args.dtype), seed=100 + i,
                          rank=args.rank, targets=tuple(targets))
        dirs.append(dest)
    return dirs


def agent_settings(args: argparse.Namespace, base: Path) -> dict[str, str]:
    """The settings both arms run with (`ADAPTERPLANE_AGENT_*` names, lower case)."""
    blocks = args.num_kv_blocks
    if blocks is None:  # every stream's KV, plus room for every adapter's pages
        c = json.loads((base / "config.json").read_text())
        layers, hidden = c["num_hidden_layers"], c["hidden_size"]
        kv = c["num_key_value_heads"] * hidden // c["num_attention_heads"]
        d = {"q_proj": 2 * hidden, "k_proj": hidden + kv, "v_proj": hidden + kv,
             "o_proj": 2 * hidden, "gate_proj": hidden + c["intermediate_size"],
             "up_proj": hidden + c["intermediate_size"],
             "down_proj": hidden + c["intermediate_size"]}
        slot = args.rank * layers * sum(d[t] for t in args.targets.split(","))
        page = 2 * layers * BLOCK_SIZE * kv
        per_seq = -(-(args.input_len + args.output_len) // BLOCK_SIZE) + 1
        blocks = args.concurrency * per_seq + args.adapters * -(-slot // page)
    return {"model_dir": str(base), "device": args.device, "dtype": args.dtype,
            "max_slots": str(args.adapters), "max_rank": str(args.rank),
            "num_kv_blocks": str(blocks), "max_num_seqs": str(args.concurrency),
            "max_num_batched_tokens": str(args.max_batched_tokens or 8192),
            "max_queued_requests": str(max(256, 2 * args.num_requests)),
            "adapter_targets": json.dumps(args.targets.split(",")),
            "scheduling_policy": "fcfs"}


def workload(args: argparse.Namespace, vocab: int, n: int, rate: float) -> list[WorkloadRequest]:
    return make_workload(WorkloadSpec(
        num_requests=n, input_len=args.input_len, output_len=args.output_len,
        vocab_size=vocab, models=tuple(f"{NAMESPACE}/a-{i}" for i in range(args.adapters)),
        request_rate=rate, seed=args.seed))


# ---- engine arm --------------------------------------------------------------------------

def drive_engine(engine: Any, handles: list[Any], requests: list[WorkloadRequest],
                 concurrency: int) -> tuple[list[RequestResult], float]:
    """Feed `requests` at their arrival times, at most `concurrency` in flight (0: no
    bound), between steps. Each request's clock starts as bench/serving.py starts it: at
    its arrival time or when a concurrency slot freed, whichever is later, so the wait for
    the next step boundary counts as it does over HTTP."""
    results = [RequestResult(r.index, r.model, len(r.prompt), r.output_len) for r in requests]
    sent: dict[str, float] = {}
    pending = deque(requests)
    t0 = time.perf_counter()
    free = deque([t0] * concurrency)  # when each free slot freed (bounded runs)
    live = 0
    while pending or engine.has_unfinished():
        now = time.perf_counter()
        while pending and pending[0].arrival_s <= now - t0 and (
                concurrency <= 0 or live < concurrency):
            r = pending.popleft()
            rid = str(r.index)
            sent[rid] = max(t0 + r.arrival_s, free.popleft() if concurrency > 0 else t0)
            results[r.index].sent_s = sent[rid] - t0
            engine.add_request(rid, r.prompt, SamplingParams(
                temperature=0.0, max_tokens=r.output_len, ignore_eos=True),
                handles[r.model_index])
            live += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, t0 + pending[0].arrival_s - time.perf_counter()))
            continue
        outs = engine.step()
        stamp = time.perf_counter()
        for o in outs:
            res = results[int(o.request_id)]
            at = stamp - sent[o.request_id]
            if o.new_token_ids:
                res.add_chunk(at, o.new_token_ids, o.new_text)
                res.output_tokens = len(res.token_ids)
            if o.finished:
                res.latency = at
                live -= 1
                if concurrency > 0:
                    free.append(stamp)
    return results, time.perf_counter() - t0


def engine_arm(args: argparse.Namespace, base: Path, adapters: list[Path], vocab: int,
               record: Any, before_timed: Callable[[], None]) -> float:
    """Both engine runs (after `before_timed()` returned); returns the Poisson rate
    (req/s) the HTTP arm must use."""
    from dataplane.engine import build_engine
    from dataplane.engine.adapters import load_peft_adapter

    settings = AgentSettings(**{k: (json.loads(v) if k == "adapter_targets" else v)
                                for k, v in agent_settings(args, base).items()})
    started = time.perf_counter()
    engine = build_engine(engine_spec(settings))
    assert engine.base_abi is not None
    handles = [engine.register_loaded_adapter(load_peft_adapter(d, engine.base_abi, args.rank))
               for d in adapters]
    print(f"# engine built with {len(handles)} adapters in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    warm = workload(args, vocab, min(len(handles), args.num_requests), math.inf)
    drive_engine(engine, handles, [WorkloadRequest(w.index, w.prompt[::-1], 2, w.model,
                                                   w.index % len(handles), 0.0)
                                   for w in warm], 0)
    before_timed()
    closed = workload(args, vocab, args.num_requests, math.inf)
    results, duration = drive_engine(engine, handles, closed, args.concurrency)
    peak = record("engine", "max-concurrency", results, duration)
    rate = args.load_fraction * peak["request_throughput"]
    poisson = workload(args, vocab, args.poisson_requests or args.num_requests, rate)
    results, duration = drive_engine(engine, handles, poisson, 0)
    record("engine", "poisson", results, duration, rate=rate)
    del engine, handles
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rate


# ---- HTTP arm ----------------------------------------------------------------------------

def publish(url: str, token: str, base: Path, adapters: list[Path]) -> None:
    """The child process's work: register, push, validate, publish (timed)."""
    started = time.perf_counter()
    publish_adapters(url, token, base, adapters, base_name=BASE_NAME, prefix="a-")
    print(f"# {len(adapters)} adapters pushed, validated and published in "
          f"{time.perf_counter() - started:.1f} s", flush=True)


def profile(args: argparse.Namespace, agent: AgentProcess) -> subprocess.Popen[bytes] | None:
    """py-spy sampling which thread holds the agent's GIL (raw stacks), started after a
    second of the run, or None when not asked for or py-spy is not installed."""
    exe = shutil.which("py-spy")
    if not args.profile_agent or exe is None or agent.proc is None:
        return None
    return subprocess.Popen(
        ["sh", "-c", f"sleep 1; exec {exe} record --pid {agent.proc.pid} --duration "
         f"{args.profile_agent:g} --rate 500 --threads --gil --nonblocking --format raw "
         f"-o {args.out_dir / 'agent-gil.prof'}"])


def http_arm(args: argparse.Namespace, stack: Any, base: Path, vocab: int,
             rate: float | None, record: Any) -> None:
    from agent.demo import _admin, _check

    with _admin(stack.url, stack.token()) as admin:
        agent_token = _check(admin.post("/v1/tokens", json={
            "name": "bench-agent", "grants": [], "is_agent": True}))["token"]
        reader = str(_check(admin.post("/v1/tokens", json={
            "name": "bench-client", "grants": [{"namespace": NAMESPACE, "role": "read"}],
            "is_agent": False}))["token"])
    env = {"ADAPTERPLANE_AGENT_CONTROL_PLANE_URL": stack.url,
           "ADAPTERPLANE_AGENT_TOKEN": agent_token, "ADAPTERPLANE_AGENT_NAME": "bench",
           "ADAPTERPLANE_AGENT_CACHE_DIR": str(stack.data_dir / "agent-cache")}
    agent = AgentProcess(args.out_dir / "agent.log", env)
    started = time.perf_counter()
    agent.start(agent_settings(args, base), timeout_s=args.agent_start_timeout)
    print(f"# agent ready in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        common = ["--base-url", agent.url, "--api-key", reader, "--model-prefix",
                  f"{NAMESPACE}/a-", "--num-models", str(args.adapters),
                  "--input-len", str(args.input_len), "--output-len",
                  str(args.output_len), "--vocab-size", str(vocab), "--seed",
                  str(args.seed)]
        # warm: every alias once (loads every adapter), as the engine arm's warm-up
        serving.benchmark(serving.parse_args([
            *common, "--num-requests", str(args.adapters), "--output-len", "2",
            "--seed", str(args.seed + 1)]))
        spy = profile(args, agent)
        doc = serving.benchmark(serving.parse_args([
            *common, "--num-requests", str(args.num_requests), "--max-concurrency",
            str(args.concurrency), "--save-tokens",
            str(args.out_dir / "http-max-concurrency.tokens.jsonl")]))
        if spy is not None:
            spy.wait()
            prof = args.out_dir / "agent-gil.prof"
            if prof.is_file():
                record.gil = gil_profile.summarize(prof, top=40)
        peak = record("http", "max-concurrency", doc, None)
        if args.also_no_stream:  # the same, answers not streamed
            doc = serving.benchmark(serving.parse_args([
                *common, "--num-requests", str(args.num_requests), "--max-concurrency",
                str(args.concurrency), "--no-stream"]))
            record("http", "max-concurrency-no-stream", doc, None)
        poisson_rate = rate if rate is not None else (
            args.load_fraction * peak["request_throughput"])
        doc = serving.benchmark(serving.parse_args([
            *common, "--num-requests", str(args.poisson_requests or args.num_requests),
            "--request-rate", str(poisson_rate)]))
        record("http", "poisson", doc, None, rate=poisson_rate)
    finally:
        agent.stop()


# ---- report ------------------------------------------------------------------------------

class Report:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runs: list[dict[str, Any]] = []
        self.tokens: dict[str, list[list[int]]] = {}
        self.gil: dict[str, Any] | None = None
        """The agent's interpreter-lock profile summary (bench/gil_profile.py)."""

    def __call__(self, arm: str, run: str, results: Any, duration: float | None,
                 rate: float | None = None) -> dict[str, Any]:
        if isinstance(results, dict):  # a bench/serving.py document
            summary = results["summary"]
        else:
            summary = summarize(results, duration or 0.0)
            if run == "max-concurrency":
                self.tokens[arm] = [r.token_ids for r in results]
        print(table(summary, f"{arm} {run}"), flush=True)
        self.runs.append({"arm": arm, "run": run, "rate": rate, "summary": summary})
        if isinstance(results, dict):
            self.runs[-1]["client_cpu_share"] = results.get("client_cpu_share")
        self.write()
        return dict(summary)

    def ratios(self) -> dict[str, Any]:
        by = {(r["arm"], r["run"]): r["summary"] for r in self.runs}
        out: dict[str, Any] = {}
        if ("http", "max-concurrency") in by and ("engine", "max-concurrency") in by:
            out["http_over_engine_output_tok_s"] = (
                by["http", "max-concurrency"]["output_throughput"]
                / by["engine", "max-concurrency"]["output_throughput"])
        if ("http", "max-concurrency-no-stream") in by and ("engine", "max-concurrency") in by:
            out["http_no_stream_over_engine_output_tok_s"] = (
                by["http", "max-concurrency-no-stream"]["output_throughput"]
                / by["engine", "max-concurrency"]["output_throughput"])
        if ("http", "poisson") in by and ("engine", "poisson") in by:
            out["http_over_engine_ttft_p99_poisson"] = (
                by["http", "poisson"]["ttft_ms"]["p99"] / by["engine", "poisson"]["ttft_ms"]["p99"])
        path = self.args.out_dir / "http-max-concurrency.tokens.jsonl"
        if "engine" in self.tokens and path.is_file():
            http = {int(row["index"]): row["token_ids"]
                    for row in map(json.loads, path.read_text().splitlines())}
            same = sum(1 for i, t in enumerate(self.tokens["engine"]) if http.get(i) == t)
            out["greedy_tokens_equal"] = f"{same}/{len(self.tokens['engine'])}"
        return out

    def write(self) -> None:
        self.args.out_dir.mkdir(parents=True, exist_ok=True)
        (self.args.out_dir / "summary.json").write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(self.args).items()}, "runs": self.runs,
            "ratios": self.ratios(), "agent_gil": self.gil}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = make_base(args)
    adapters = make_adapters(args, base)
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    report = Report(args)
    arms = args.arms.split(",")
    from cli.stack import EmbeddedStack

    with EmbeddedStack(args.workdir / f"stack-{int(time.time())}", port=0,
                       embedded_only=True) as stack:
        publisher = mp.get_context("spawn").Process(
            target=publish, args=(stack.url, stack.token(), base, adapters))
        publisher.start()

        def published() -> None:
            publisher.join()
            if publisher.exitcode != 0:
                raise RuntimeError(f"publishing the adapters failed ({publisher.exitcode})")

        rate = args.poisson_rate
        if "engine" in arms:
            rate = engine_arm(args, base, adapters, vocab, report, published)
        published()
        if "http" in arms:
            http_arm(args, stack, base, vocab, rate, report)
    print(json.dumps(report.ratios()), flush=True)


if __name__ == "__main__":
    main()
