"""Hotswap soak: completions across 8 aliases while a driver republishes and rolls back.

Clients send completions to the 8 aliases (some pinned to a generation the driver made),
while the driver changes one alias every ~50 ms after the last change returned
(publish of a random artifact, or a rollback; the control plane's answer time bounds
the rate). Every response must be 200 and name a generation whose artifact is the one
the control plane recorded for it, with tokens equal to the HF + PEFT reference of that
artifact. The count of wrong responses must be 0; the p99 latency is reported.

CI runs `SOAK_COMPLETIONS` (400) completions. The full soak is

    ADAPTERPLANE_SOAK_COMPLETIONS=10000 .venv/bin/python -m pytest \
        tests/agent/test_hotswap_soak.py -s

(with the test environment of scripts/test.sh); it prints one JSON line of results.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from .assets import GreedyReference
from .conftest import Deployment

SOAK_COMPLETIONS = int(os.environ.get("ADAPTERPLANE_SOAK_COMPLETIONS", "400"))
ALIASES = [f"soak-{i}" for i in range(8)]
ARTIFACTS = ("a", "b", "c", "d")
PROMPTS = ([3, 1, 4], [1, 5, 9, 2], [6, 5], [3, 5, 8, 9])
MAX_TOKENS = 3
SWITCH_EVERY_S = 0.05
CLIENTS = 4


class Driver:
    """Changes one alias every SWITCH_EVERY_S; records each generation's artifact."""

    def __init__(self, dep: Deployment, seed: int) -> None:
        self.dep, self.rng = dep, random.Random(seed)
        self.by_id = {int(dep.artifacts[n]["id"]): n for n in ARTIFACTS}
        self.made: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.switches = 0

    def record(self, doc: dict[str, Any]) -> None:
        with self.lock:
            self.made[(doc["alias"], int(doc["generation"]))] = self.by_id[
                int(doc["artifact"]["id"])]

    def change(self, alias: str, rollback: bool) -> None:
        ns, admin = self.dep.namespace, self.dep.admin
        if rollback:
            r = admin.http.post(f"/v1/namespaces/{ns}/aliases/{alias}/rollback", json={})
            if r.status_code in (200, 201):
                self.record(r.json())
                return
            assert r.status_code == 409, r.text  # nothing to roll back to: publish instead
        name = self.rng.choice(ARTIFACTS)
        self.record(admin.call("POST", f"/v1/namespaces/{ns}/aliases/{alias}/publish",
                               json={"artifact": str(self.dep.artifacts[name]["id"])}))

    def run(self) -> None:
        while not self.stop.wait(SWITCH_EVERY_S):
            alias = self.rng.choice(ALIASES)
            with self.lock:
                gens = sorted(g for a, g in self.made if a == alias)
            self.change(alias, rollback=len(gens) >= 2 and self.rng.random() < 0.4)
            self.switches += 1

    def pin(self, alias: str) -> int | None:
        with self.lock:
            gens = [g for a, g in self.made if a == alias]
        return self.rng.choice(gens) if gens else None


def test_hotswap_soak_serves_only_the_generation_it_names(
        deployment: Deployment, reference: GreedyReference) -> None:
    dep = deployment
    driver = Driver(dep, seed=11)
    for alias in ALIASES:
        driver.change(alias, rollback=False)
    expected = {(tuple(p), n): reference.greedy(p, MAX_TOKENS, n) for p in PROMPTS
                for n in ARTIFACTS}
    results: list[tuple[str, int, str, tuple[int, ...], list[int], int, float]] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {dep.reader_token}"}

    def client(seed: int, count: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=dep.agent.url, headers=headers, timeout=120) as http:
            for _ in range(count):
                alias, prompt = rng.choice(ALIASES), rng.choice(PROMPTS)
                pinned = driver.pin(alias) if rng.random() < 0.3 else None
                model = f"{dep.namespace}/{alias}" + (f"@{pinned}" if pinned else "")
                started = time.monotonic()
                r = http.post("/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True})
                took = time.monotonic() - started
                doc = r.json() if r.status_code == 200 else {}
                bind = doc.get("adapterplane") or {}
                tokens = doc["choices"][0]["token_ids"] if doc else []
                row = (alias, int(bind.get("generation", -1)),
                       str(bind.get("artifact_digest")), tuple(prompt), tokens,
                       r.status_code, took)
                with lock:
                    results.append(row)
                if pinned is not None and bind:
                    assert bind["generation"] == pinned

    switcher = threading.Thread(target=driver.run, daemon=True)
    switcher.start()
    started = time.monotonic()
    try:
        per = SOAK_COMPLETIONS // CLIENTS
        with ThreadPoolExecutor(CLIENTS) as pool:
            for f in [pool.submit(client, seed, per) for seed in range(CLIENTS)]:
                f.result()
    finally:
        driver.stop.set()
        switcher.join(timeout=10)
        for alias in ALIASES:  # the deployment is shared: placement forgets these
            dep.admin.retire(dep.namespace, alias)
    elapsed = time.monotonic() - started

    digest = {n: dep.artifacts[n]["digest"] for n in ARTIFACTS}
    failed = [r for r in results if r[5] != 200]
    wrong = [r for r in results if r[5] == 200 and (
        (r[0], r[1]) not in driver.made
        or r[2] != digest[driver.made[(r[0], r[1])]]
        or r[4] != expected[(r[3], driver.made[(r[0], r[1])])])]
    latencies = sorted(r[6] for r in results)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(json.dumps({"completions": len(results), "alias_changes": driver.switches,
                      "wrong": len(wrong), "failed": len(failed),
                      "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
                      "p99_ms": round(p99 * 1000, 1), "seconds": round(elapsed, 1)}))
    assert len(results) == per * CLIENTS
    assert failed == [], failed[:5]
    assert wrong == [], wrong[:5]
    assert driver.switches >= 10  # the aliases really changed under the clients
