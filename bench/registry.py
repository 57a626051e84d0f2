"""Registry benchmark: resolve and publish over real HTTP on Postgres with 100,000 aliases.

    .venv/bin/python -m bench.registry [--database-url URL] [--aliases 100000]

1. migrates the database (Alembic) and seeds `--aliases` aliases in `--namespaces`
   namespaces with SQLAlchemy Core bulk inserts (skipped when already seeded;
   `--reseed` deletes and re-creates the `bench-*` namespaces);
2. creates an admin token (`create_bootstrap_token`) and starts the real API server
   (`adapterplane api`, uvicorn, `--server-workers` processes) on a free port;
3. runs closed-loop HTTP clients (bench/registry_load.py): resolve with 1 client
   (latency floor) and with `--clients x --threads` clients (throughput), then publish
   the same way (publish appends real generations + audit rows to random seeded aliases);
4. prints a markdown table (throughput, p50, p99) and the targets.

Target: resolve p99 < 10 ms and >= 1,000 resolves/s at 8 clients on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from bench.registry_load import LoadResult, LoadSpec, run_load
from bench.registry_seed import existing_layout, reset, seed
from cli.stack import free_port
from controlplane.auth.service import create_bootstrap_token
from controlplane.db import make_engine, make_session_factory
from controlplane.migrate import upgrade_to_head

DEFAULT_URL = "postgresql+psycopg://adapterplane:adapterplane@127.0.0.1:5432/adapterplane"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--database-url", default=os.environ.get("ADAPTERPLANE_BENCH_DATABASE_URL", DEFAULT_URL)
    )
    p.add_argument("--aliases", type=int, default=100_000)
    p.add_argument("--namespaces", type=int, default=100)
    p.add_argument("--reseed", action="store_true")
    p.add_argument("--server-workers", type=int, default=1,
                   help="API processes (one event loop each; on 2 cores one leaves a core "
                        "to the clients and Postgres)")
    p.add_argument("--clients", type=int, default=8,
                   help="client processes (one connection each: no client GIL in the latency)")
    p.add_argument("--threads", type=int, default=1, help="threads per client process")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--publish-duration", type=float, default=10.0)
    return p.parse_args(argv)


def start_server(database_url: str, workers: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "ADAPTERPLANE_DATABASE_URL": database_url,
        "ADAPTERPLANE_DATA_DIR": str(log.parent),
    }
    handle = log.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.launcher",
            "api",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"API exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"API not ready after 60 s; see {log}")


def table(rows: list[LoadResult]) -> str:
    lines = [
        "| operation | concurrent clients | requests | errors | throughput (req/s) "
        "| p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.op} | {r.concurrency} | {len(r.latencies_ms)} | {r.errors} "
            f"| {r.throughput:,.0f} | {r.percentile(0.50):.2f} "
            f"| {r.percentile(0.99):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    per_namespace = args.aliases // args.namespaces
    url = args.database_url
    print(f"database: {make_url(url).render_as_string(hide_password=True)}", file=sys.stderr)
    upgrade_to_head(url)
    engine = make_engine(url)
    if args.reseed:
        reset(engine)
    layout = existing_layout(engine, args.namespaces, per_namespace)
    if layout is None:
        reset(engine)
        t0 = time.perf_counter()
        layout = seed(engine, args.namespaces, per_namespace)
        print(
            f"seeded {layout.aliases:,} aliases in {time.perf_counter() - t0:.1f}s", file=sys.stderr
        )
    else:
        print(f"reusing {layout.aliases:,} seeded aliases", file=sys.stderr)
    with make_session_factory(engine)() as session:
        token = create_bootstrap_token(session, "bench-registry")
    engine.dispose()

    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    port = free_port()
    run_dir = Path("var/bench-registry").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    server = start_server(url, args.server_workers, port, run_dir / "api.log")
    results: list[LoadResult] = []
    try:
        for op, duration in (("resolve", args.duration), ("publish", args.publish_duration)):
            for processes, threads in ((1, 1), (args.clients, args.threads)):
                spec = LoadSpec(
                    op=op,
                    host="127.0.0.1",
                    port=port,
                    token=token,
                    namespaces=args.namespaces,
                    per_namespace=per_namespace,
                    artifact_ids=layout.artifact_ids,
                    duration_s=duration,
                    warmup_s=args.warmup,
                    threads=threads,
                )
                result = run_load(spec, processes)
                print(
                    f"{op} x{result.concurrency}: {result.throughput:,.0f} req/s, "
                    f"statuses {result.statuses}",
                    file=sys.stderr,
                )
                results.append(result)
    finally:
        server.terminate()
        server.wait(timeout=30)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\n{layout.aliases:,} aliases, API `adapterplane api --workers "
        f"{args.server_workers}`, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average (1/5/15 min) before {load_before}, at the end {load} (shared machine)\n"
    )
    print(table(results))
    resolve = max((r for r in results if r.op == "resolve"), key=lambda r: r.throughput)
    p99 = max(r.percentile(0.99) for r in results if r.op == "resolve")
    print(
        f"\ntarget resolve p99 < 10 ms: {'met' if p99 < 10 else 'NOT met'} ({p99:.2f} ms); "
        f">= 1,000 resolves/s: {'met' if resolve.throughput >= 1000 else 'NOT met'} "
        f"({resolve.throughput:,.0f}/s)"
    )


if __name__ == "__main__":
    main()
