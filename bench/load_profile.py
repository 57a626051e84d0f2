"""Mixed load profile: resolve, history, push and completions at once (locust, headless).

    .venv/bin/python -m bench.load_profile [--users 8] [--duration 30]

1. starts the control plane (`adapterplane api` + worker) on Postgres and Redis
   (`scripts/services.sh`; database `--database-url`), registers a tiny Llama base,
   pushes and publishes `--aliases` PEFT adapters, and starts one CPU agent on it;
2. runs `locust -f bench/locustfile.py --headless` with `--users` closed-loop users
   (3 registry users per completion user) for `--duration` seconds after a warm-up;
3. prints a markdown table per request kind: requests, failures, req/s, p50, p99.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from agent.demo import start_demo_agent
from agent.supervisor import AgentProcess
from cli.stack import EmbeddedStack
from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama

DEFAULT_URL = "postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane"
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", default=DEFAULT_URL)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--duration", type=int, default=30, help="measured seconds")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--aliases", type=int, default=4)
    return p.parse_args(argv)


def _call(http: httpx.Client, method: str, path: str, **kw: object) -> dict[str, object]:
    r = http.request(method, path, **kw)  # type: ignore[arg-type]
    if r.status_code >= 400:
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
    return dict(r.json())


def seed(stack: EmbeddedStack, work: Path, aliases: int) -> tuple[dict[str, str], AgentProcess]:
    """Base, namespace, `aliases` validated and published adapters and an agent serving
    them; returns the locust environment and the agent."""
    base = make_tiny_llama(work / "base", seed=0)
    ns = f"load-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.url, timeout=60,
                      headers={"Authorization": f"Bearer {stack.token()}"}) as http:
        h_base = str(_call(http, "POST", "/v1/bases", json={
            "name": f"tiny-{ns}", "abi": read_base_abi(base).to_record()})["h_base"])
        _call(http, "POST", "/v1/namespaces", json={"name": ns})
        names = []
        for i in range(aliases):
            adapter = make_peft_adapter(base, work / f"a{i}", seed=i + 1, rank=8, alpha=16,
                                        target_modules=["q_proj", "v_proj"])
            files = {n: (n, (adapter / n).read_bytes())
                     for n in ("adapter_config.json", "adapter_model.safetensors")}
            art = _call(http, "POST", f"/v1/namespaces/{ns}/artifacts",
                        data={"base": h_base}, files=files)
            deadline = time.monotonic() + 120
            while art["state"] not in ("validated", "rejected"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"artifact {art['id']} still {art['state']}")
                time.sleep(0.2)
                art = _call(http, "GET", f"/v1/namespaces/{ns}/artifacts/{art['id']}")
            _call(http, "POST", f"/v1/namespaces/{ns}/aliases/bot-{i}/publish",
                  json={"artifact": str(art["id"])})
            names.append(f"bot-{i}")
    agent, reader = start_demo_agent(stack.url, stack.token(), base, work, ns,
                                     name=f"load-agent-{ns}", max_slots=str(aliases))
    env = {"LOAD_CP_URL": stack.url, "LOAD_AGENT_URL": agent.url, "LOAD_NAMESPACE": ns,
           "LOAD_ALIASES": json.dumps(names), "LOAD_ADMIN_TOKEN": stack.token(),
           "LOAD_READER_TOKEN": reader, "LOAD_ADAPTER_DIR": str(work / "a0"),
           "LOAD_H_BASE": h_base}
    return env, agent


def run_locust(env: dict[str, str], users: int, seconds: int, out: Path) -> list[dict[str, str]]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--csv", str(out),
           "--only-summary", "--loglevel", "WARNING"]
    subprocess.run(cmd, env={**os.environ, **env}, check=False, timeout=seconds + 120)
    with open(f"{out}_stats.csv", newline="") as f:
        return list(csv.DictReader(f))


def table(rows: list[dict[str, str]], seconds: int) -> str:
    lines = ["| request | requests | failures | req/s | p50 ms | p99 ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["Name"] == "Aggregated":
            continue
        lines.append(f"| {r['Name']} | {int(r['Request Count']):,} | {r['Failure Count']} "
                     f"| {int(r['Request Count']) / seconds:,.0f} | {r['50%']} | {r['99%']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="adapterplane-load-") as tmp:
        work = Path(tmp)
        extra = {"ADAPTERPLANE_DATABASE_URL": args.database_url,
                 "ADAPTERPLANE_CELERY_BROKER_URL": args.redis_url,
                 "ADAPTERPLANE_CELERY_RESULT_BACKEND": args.redis_url,
                 "ADAPTERPLANE_LOG_LEVEL": "warning"}
        with EmbeddedStack(work / "cp", port=0, extra_env=extra) as stack:
            env, agent = seed(stack, work, args.aliases)
            try:
                run_locust(env, args.users, args.warmup, work / "warmup")
                load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
                rows = run_locust(env, args.users, args.duration, work / "run")
            finally:
                agent.stop()
    print(f"{args.users} users (3 registry : 1 completion), {args.duration} s, "
          f"load before {load}")
    print(table(rows, args.duration))


if __name__ == "__main__":
    main()
