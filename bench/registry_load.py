"""HTTP load generator for the registry benchmark: processes x threads, keep-alive.

Each client thread holds one persistent `http.client` connection (the lightest client
in the standard library, so the 2-core machine spends its CPU on the server, not on
the client) and sends requests back to back. All processes share a wall-clock start;
the first `warmup_s` seconds are not recorded. Latency is measured around one full
request/response on the client (perf_counter), so it includes the client's own cost.
"""

from __future__ import annotations

import http.client
import json
import math
import multiprocessing as mp
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.registry_seed import alias_name, namespace_name


@dataclass(frozen=True)
class LoadSpec:
    op: str
    """`resolve` (GET alias) or `publish` (POST publish, no compare-and-swap)."""
    host: str
    port: int
    token: str
    namespaces: int
    per_namespace: int
    artifact_ids: dict[str, list[int]]
    duration_s: float
    warmup_s: float
    threads: int


@dataclass
class LoadResult:
    op: str
    concurrency: int
    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.duration_s

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the recorded latencies (ms); NaN when empty."""
        if not self.latencies_ms:
            return math.nan
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _request(spec: LoadSpec, rng: random.Random) -> tuple[str, str, bytes | None]:
    ns = namespace_name(rng.randrange(spec.namespaces))
    alias = alias_name(rng.randrange(spec.per_namespace))
    path = f"/v1/namespaces/{ns}/aliases/{alias}"
    if spec.op == "resolve":
        return "GET", path, None
    artifact = rng.choice(spec.artifact_ids[ns])
    body = json.dumps({"artifact": str(artifact), "reason": "bench"}).encode()
    return "POST", f"{path}/publish", body


def _thread_main(spec: LoadSpec, seed: int, start: float, out: dict[str, Any]) -> None:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {spec.token}", "Content-Type": "application/json"}
    ok_status = 200 if spec.op == "resolve" else 201
    record_from, stop_at = start + spec.warmup_s, start + spec.warmup_s + spec.duration_s
    latencies: list[float] = []
    errors = 0
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection(spec.host, spec.port, timeout=30)
    time.sleep(max(0.0, start - time.time()))
    while True:
        if time.time() >= stop_at:
            break
        method, path, body = _request(spec, rng)
        t0 = time.perf_counter()
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection(spec.host, spec.port, timeout=30)
            status = -1
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        if time.time() >= record_from:
            statuses[status] = statuses.get(status, 0) + 1
            if status == ok_status:
                latencies.append(elapsed_ms)
            else:
                errors += 1
    conn.close()
    out.update(latencies=latencies, errors=errors, statuses=statuses)


def _process_main(spec: LoadSpec, index: int, start: float, queue: Any) -> None:
    outs: list[dict[str, Any]] = [{} for _ in range(spec.threads)]
    threads = [
        threading.Thread(target=_thread_main, args=(spec, index * 1000 + t, start, outs[t]))
        for t in range(spec.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put(outs)


def run_load(spec: LoadSpec, processes: int) -> LoadResult:
    """Run `processes` x `spec.threads` closed-loop clients; merge their measurements."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start = time.time() + 1.0
    procs = [
        ctx.Process(target=_process_main, args=(spec, i, start, queue)) for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    result = LoadResult(spec.op, processes * spec.threads, spec.duration_s)
    for _ in procs:
        for out in queue.get():
            result.latencies_ms.extend(out["latencies"])
            result.errors += out["errors"]
            for status, count in out["statuses"].items():
                result.statuses[status] = result.statuses.get(status, 0) + count
    for proc in procs:
        proc.join()
    return result
