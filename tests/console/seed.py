"""A seeded registry for the console's browser tests and screenshots.

Everything goes through the real paths: `adapterctl` (in-process Typer app, real HTTP)
registers a tiny base, pushes two adapters and a NaN-poisoned one through the worker's
validation (rejected `non_finite`), and publishes alias `bot` twice. An agent token
registers two agents: `gpu-a`, whose URL is a real Prometheus HTTP server exposing an
`AgentMetrics` registry (agent/metrics.py) with known observations, and `gpu-b`, whose
URL refuses connections (its live numbers are "unavailable").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from prometheus_client import start_http_server
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from agent.event_ledger import EventLedger, Lookup
from agent.metrics import AgentMetrics
from cli.main import app as adapterctl_app
from dataplane.assets import make_peft_adapter, make_tiny_llama

NAMESPACE = "demo"
ALIAS = "bot"
TTFT_FAST_S, TTFT_SLOW_S = 0.003, 0.03
"""Observed TTFTs: 60 requests at 3 ms and 40 at 30 ms (see test_live_metrics.py)."""


@dataclass
class Seeded:
    url: str
    admin: str
    reader: str
    """A token with read on NAMESPACE only."""
    artifacts: dict[str, dict[str, Any]]
    """`a`, `b` (validated), `nan` (rejected), as `adapterctl push` answered."""
    agents: dict[str, int]
    metrics: AgentMetrics
    metrics_server: Any
    assets_root: Path
    """Holds `base/` (the tiny Llama the artifacts adapt), `a/`, `b/`, `nan/`."""
    agent_token: str
    beats: dict[str, dict[str, Any]]
    """Each agent's seeded heartbeat, by name."""

    def heartbeat(self) -> None:
        """Send every agent's seeded heartbeat again: an agent not heard from within the
        liveness window shows as stale, and a session's console tests can outlast it."""
        with httpx.Client(base_url=self.url, timeout=10,
                          headers={"Authorization": f"Bearer {self.agent_token}"}) as http:
            for name, beat in self.beats.items():
                http.post(f"/v1/agents/{self.agents[name]}/heartbeat",
                          json=beat).raise_for_status()


def adapterctl(url: str, token: str, *args: str, check: bool = True) -> Any:
    """`adapterctl -o json ARGS` in-process (real HTTP); its JSON answer (None when it
    printed none). `check=False` accepts a non-zero exit (a refusal it reports)."""
    result = CliRunner().invoke(adapterctl_app, ["-o", "json", *args],
                                env={"ADAPTERPLANE_URL": url, "ADAPTERPLANE_TOKEN": token},
                                catch_exceptions=False)
    if not check:
        return None
    if result.exit_code != 0:
        raise RuntimeError(f"adapterctl {' '.join(args)}: {result.output}")
    return json.loads(result.stdout) if result.stdout.strip() else None


def make_assets(root: Path) -> dict[str, Path]:
    base = make_tiny_llama(root / "base", seed=4242)
    a = make_peft_adapter(base, root / "a", seed=1, rank=4, alpha=8,
                          target_modules=["q_proj", "v_proj"])
    b = make_peft_adapter(base, root / "b", seed=2, rank=2, alpha=4,
                          target_modules=["q_proj", "k_proj", "o_proj"])
    nan = root / "nan"
    nan.mkdir()
    (nan / "adapter_config.json").write_bytes((a / "adapter_config.json").read_bytes())
    tensors = load_file(a / "adapter_model.safetensors")
    name = sorted(k for k in tensors if "lora_B" in k)[0]
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] = torch.nan
    save_file(tensors, nan / "adapter_model.safetensors")
    return {"base": base, "a": a, "b": b, "nan": nan}


def observed_metrics() -> AgentMetrics:
    """An agent's metrics after 100 admitted requests (60 fast, 40 slow first tokens),
    3 cache hits in 4 lookups, and a unified pool of 40 adapter / 100 KV / 116 free pages."""
    metrics = AgentMetrics()
    ledger = EventLedger()
    metrics.watch_events(ledger)
    for i, lookup in enumerate((Lookup.HIT, Lookup.HIT, Lookup.HIT, Lookup.COLD_MISS)):
        ledger.enqueued(f"r{i}", 0.0, NAMESPACE, lookup)
    for ttft in [TTFT_FAST_S] * 60 + [TTFT_SLOW_S] * 40:
        metrics.admitted.labels("le4").inc()
        metrics.ttft.labels("resident").observe(ttft)
    metrics.pool_pages.labels("adapter", "used").set(40)
    metrics.pool_pages.labels("kv", "used").set(100)
    metrics.pool_pages.labels("pool", "free").set(116)
    return metrics


def _register_agent(http: httpx.Client, name: str, url: str, h_base: str,
                    slots: list[dict[str, Any]], failures: list[dict[str, Any]]
                    ) -> tuple[int, dict[str, Any]]:
    caps = {"base": h_base, "dtypes": ["float16"], "max_rank": 16,
            "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "adapter_slots": 4,
            "pool_pages": 256, "page_bytes": 65536, "kv_reserve_pages": 64}
    reg = http.post("/v1/agents/register", json={"name": name, "url": url,
                                                 "capabilities": caps})
    reg.raise_for_status()
    agent = reg.json()
    beat = {"worker_epoch": agent["worker_epoch"], "catalog_version": 2, "live_requests": 3,
            "waiting_requests": 1, "free_pages": 116, "pool_pages": 256, "slots": slots,
            "load_failures": failures}
    http.post(f"/v1/agents/{agent['id']}/heartbeat", json=beat).raise_for_status()
    return int(agent["id"]), beat


def seed(url: str, admin: str, root: Path, free_port: int, dead_port: int) -> Seeded:
    assets = make_assets(root)
    h_base = adapterctl(url, admin, "bases", "register", str(assets["base"]),
                        "--name", "tiny-llama")["h_base"]
    adapterctl(url, admin, "namespaces", "create", NAMESPACE)
    pushed = {name: adapterctl(url, admin, "push", str(assets[name]), "-n", NAMESPACE,
                               "-b", h_base, "--wait", "--timeout", "60")
              for name in ("a", "b")}
    # validation rejects it, so `push --wait` exits non-zero; the listing has its row
    adapterctl(url, admin, "push", str(assets["nan"]), "-n", NAMESPACE, "-b", h_base,
               "--wait", "--timeout", "60", check=False)
    rejected = adapterctl(url, admin, "artifacts", "list", NAMESPACE, "--state", "rejected")
    if len(rejected["items"]) != 1:
        raise RuntimeError(f"expected one rejected artifact, got {rejected}")
    pushed["nan"] = rejected["items"][0]
    ref = f"{NAMESPACE}/{ALIAS}"
    adapterctl(url, admin, "publish", ref, str(pushed["a"]["id"]), "--reason",
               "first release", "--expected-generation", "0")
    adapterctl(url, admin, "publish", ref, str(pushed["b"]["id"]), "--reason",
               "rank-2 retune", "--expected-generation", "1")
    reader = adapterctl(url, admin, "tokens", "create", "--name", "viewer", "--grant",
                        f"{NAMESPACE}:read")["token"]
    agent_token = adapterctl(url, admin, "tokens", "create", "--name", "agents",
                             "--agent")["token"]
    metrics = observed_metrics()
    server, _thread = start_http_server(free_port, addr="127.0.0.1", registry=metrics.registry)
    slots = [{"artifact_digest": pushed["b"]["digest"], "artifact_id": pushed["b"]["id"],
              "state": "active", "refcount": 2, "slot": 0, "slot_generation": 3,
              "prefetch": True, "rate": 4.5},
             {"artifact_digest": pushed["a"]["digest"], "artifact_id": pushed["a"]["id"],
              "state": "idle", "slot": 1, "slot_generation": 1}]
    failures = [{"artifact": pushed["a"]["digest"], "error": "CUDA out of memory",
                 "stage": "copy", "at": time.time() - 90}]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {agent_token}"},
                      timeout=10) as http:
        registered = {
            "gpu-a": _register_agent(http, "gpu-a", f"http://127.0.0.1:{free_port}", h_base,
                                     slots, failures),
            "gpu-b": _register_agent(http, "gpu-b", f"http://127.0.0.1:{dead_port}", h_base,
                                     [], []),
        }
    return Seeded(url, admin, reader, pushed, {n: r[0] for n, r in registered.items()},
                  metrics, server, root, agent_token,
                  {n: r[1] for n, r in registered.items()})
