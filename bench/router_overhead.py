"""What the router adds to a request: latency against the same agent, and CPU per request.

    .venv/bin/python -m bench.router_overhead [--requests 400] [--concurrency 16]

1. starts the control plane (Postgres + Redis, as bench/load_profile.py), a tiny Llama
   base with one published adapter, one CPU agent serving it, and one router in front;
2. latency: `--requests` small completions one at a time (keep-alive connections), each
   kind alternating direct-to-agent and through-the-router request by request, so both
   see the same agent state: non-streaming (`max_tokens` 1) and streaming (`max_tokens`
   4, to the last byte). Added latency = router p50 (p99) - direct p50 (p99);
3. cost: the router process's CPU time (user + system, from /proc) over the router's
   requests, so one router core sustains 1 / (CPU s per request) requests per second
   whatever the agents' speed; then `--concurrency` closed-loop clients through the
   router for `--seconds`, to show the router is not what limits the fleet's rate
   (the agent is).

On a machine with two or more cores the agent (one torch thread) is pinned to the first
core and everything else (control plane, router, client) to the others, so the router's
CPU work does not slow the agent's decode steps: in a deployment routers and agents run
on different machines, and what is measured is the router's own hop. `--no-pin` shares
every core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agent.router.process import RouterProcess
from bench.load_profile import DEFAULT_URL, seed
from cli.stack import EmbeddedStack


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", default=DEFAULT_URL)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    p.add_argument("--requests", type=int, default=400, help="per kind and path")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--pin", action=argparse.BooleanOptionalAction,
                   default=len(os.sched_getaffinity(0)) >= 2)
    return p.parse_args(argv)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one(http: httpx.Client, url: str, body: dict[str, object]) -> float:
    started = time.perf_counter()
    if body.get("stream"):
        with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            for _ in r.iter_bytes():
                pass
    else:
        r = http.post(f"{url}/v1/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.read()[:200]!r}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin:
        os.environ["OMP_NUM_THREADS"] = "1"  # the agent's torch: one thread on its core
        os.sched_setaffinity(0, set(cpus[1:]))  # children inherit: control plane, router
    with tempfile.TemporaryDirectory(prefix="adapterplane-router-") as tmp:
        work = Path(tmp)
        extra = {"ADAPTERPLANE_DATABASE_URL": args.database_url,
                 "ADAPTERPLANE_CELERY_BROKER_URL": args.redis_url,
                 "ADAPTERPLANE_CELERY_RESULT_BACKEND": args.redis_url,
                 "ADAPTERPLANE_LOG_LEVEL": "warning"}
        with EmbeddedStack(work / "cp", port=0, extra_env=extra) as stack:
            env, agent = seed(stack, work, 1)
            if args.pin and agent.proc is not None:
                pin(agent.proc.pid, {cpus[0]})
            router = RouterProcess(work / "router.log", {
                "ADAPTERPLANE_ROUTER_CONTROL_PLANE_URL": stack.url,
                "ADAPTERPLANE_ROUTER_TOKEN": stack.token()})
            try:
                router.start()
                run(args, agent.url, router, env)
            finally:
                router.stop()
                agent.stop()


def run(args: argparse.Namespace, agent_url: str, router: RouterProcess,
        env: dict[str, str]) -> None:
    headers = {"Authorization": f"Bearer {env['LOAD_READER_TOKEN']}"}
    model = f"{env['LOAD_NAMESPACE']}/bot-0"
    kinds = {"non-streaming": {"model": model, "prompt": [5, 6, 7, 8], "max_tokens": 1,
                               "temperature": 0},
             "streaming": {"model": model, "prompt": [5, 6, 7, 8], "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True, "stream": True}}
    assert router.proc is not None
    pid = router.proc.pid
    print("| kind | direct p50 ms | router p50 ms | added p50 ms | direct p99 ms "
          "| router p99 ms | added p99 ms | router CPU ms/request |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with httpx.Client(headers=headers, timeout=60) as http:
        for kind, body in kinds.items():
            for _ in range(20):  # warm both paths (connections, caches)
                one(http, agent_url, body)
                one(http, router.url, body)
            direct: list[float] = []
            routed: list[float] = []
            cpu = 0.0
            for _ in range(args.requests):
                direct.append(one(http, agent_url, body))
                before = cpu_seconds(pid)
                routed.append(one(http, router.url, body))
                cpu += cpu_seconds(pid) - before
            d50, r50 = statistics.median(direct) * 1e3, statistics.median(routed) * 1e3
            d99, r99 = pct(direct, 0.99) * 1e3, pct(routed, 0.99) * 1e3
            print(f"| {kind} | {d50:.2f} | {r50:.2f} | {r50 - d50:+.2f} | {d99:.2f} "
                  f"| {r99:.2f} | {r99 - d99:+.2f} | {cpu / args.requests * 1e3:.2f} |")
    closed_loop(args, router, headers, kinds["non-streaming"], pid)


def closed_loop(args: argparse.Namespace, router: RouterProcess, headers: dict[str, str],
                body: dict[str, object], pid: int) -> None:
    done = [0] * args.concurrency
    stop = time.monotonic() + args.seconds

    def client(k: int) -> None:
        with httpx.Client(headers=headers, timeout=60) as http:
            while time.monotonic() < stop:
                one(http, router.url, body)
                done[k] += 1

    before, started = cpu_seconds(pid), time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic() - started, cpu_seconds(pid) - before
    total = sum(done)
    print(f"\n{args.concurrency} closed-loop clients through the router, {elapsed:.1f} s: "
          f"{total / elapsed:,.0f} requests/s (agent-bound), router CPU "
          f"{cpu / elapsed * 100:.0f}% of one core, {cpu / total * 1e3:.2f} ms/request "
          f"-> one router core sustains ~{total / cpu:,.0f} requests/s")


if __name__ == "__main__":
    main()
