"""A merged release served end to end: real processes (control plane with its worker, an
agent of the source base, an agent of the release, a router), the official openai client,
HF + PEFT as the reference.

The alias moves live adapter -> merged release -> (rollback) live adapter, and each answer
must carry the generation it ran on and the same greedy tokens as the reference (fp32: the
merged weights are the base plus the adapter's delta, computed once in float32). Base
placement moves an agent of the source base onto the release (`adapterctl agents assign`)
and back, in the same process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from agent.router.process import RouterProcess
from cli.main import app
from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama

from .assets import GreedyReference, write_byte_tokenizer
from .conftest import Deployment
from .stack import AgentProcess

MAX_TOKENS = 6
ADAPTER = dict(seed=41, rank=8, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])


@dataclass
class Release:
    dep: Deployment
    namespace: str
    alias: str
    h_base: str
    artifact: dict[str, Any]
    merge: dict[str, Any]
    reference: GreedyReference
    live: AgentProcess
    merged: AgentProcess
    router: RouterProcess
    reader: str
    root: Path
    common_env: dict[str, str]

    @property
    def model(self) -> str:
        return f"{self.namespace}/{self.alias}"

    def client(self, url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=self.reader, max_retries=0,
                             timeout=60.0)

    def catalog(self, action: str, **body: Any) -> int:
        gen = self.dep.admin.call(
            "POST", f"/v1/namespaces/{self.namespace}/aliases/{self.alias}/{action}", json=body)
        return int(gen["generation"])

    def wait_router_at(self, generation: int, timeout_s: float = 15.0) -> None:
        """Until the router's table names `generation` as the alias's current one."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = complete(self.client(self.router.url), self.model, [5, 6, 7], 1)
            if got.model_extra["adapterplane"]["generation"] == generation:
                return
            assert time.monotonic() < deadline, f"router never reached generation {generation}"
            time.sleep(0.1)


def _upload_checkpoint(dep: Deployment, base: Path) -> str:
    """The base checkpoint in the test bucket; its s3:// URI (what the merge job reads)."""
    prefix = f"checkpoints/{uuid.uuid4().hex[:8]}"
    for path in sorted(base.iterdir()):
        dep.s3.put_object(Bucket=dep.bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    return f"s3://{dep.bucket}/{prefix}"


def _wait_merged(dep: Deployment, namespace: str, merge_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        merge = dep.admin.call("GET", f"/v1/namespaces/{namespace}/merges/{merge_id}")
        if merge["state"] in ("merged", "rejected"):
            assert merge["state"] == "merged", merge
            return dict(merge)
        assert time.monotonic() < deadline, f"merge {merge_id} still {merge['state']}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def release(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Release]:
    root = tmp_path_factory.mktemp("release")
    base = make_tiny_llama(root / "release-base", seed=31)
    write_byte_tokenizer(base)
    adapter = make_peft_adapter(base, root / "support", **ADAPTER)
    admin = deployment.admin
    h_base = str(admin.call("POST", "/v1/bases", json={
        "name": "release-tiny", "abi": read_base_abi(base).to_record()})["h_base"])
    namespace = f"mr-{uuid.uuid4().hex[:8]}"
    admin.call("POST", "/v1/namespaces", json={"name": namespace})
    artifact = admin.push(namespace, h_base, adapter)
    admin.publish(namespace, "support", artifact["id"])
    submitted = admin.call("POST", f"/v1/namespaces/{namespace}/merges", json={
        "name": "support-merged", "base": h_base, "dtype": "fp32",
        "base_uri": _upload_checkpoint(deployment, base),
        "adapters": [{"artifact": str(artifact["id"])}]})
    merge = _wait_merged(deployment, namespace, int(submitted["id"]))
    reader = admin.token(f"{namespace}-reader", [{"namespace": namespace, "role": "read"}])
    router_token = admin.token(f"{namespace}-router", [{"namespace": "*", "role": "read"}])
    common = {**deployment.agent_env, "ADAPTERPLANE_AGENT_MODEL_DIR": str(base)}
    live = AgentProcess(root / "live.log", {
        **common, "ADAPTERPLANE_AGENT_NAME": f"{namespace}-live",
        "ADAPTERPLANE_AGENT_CACHE_DIR": str(root / "cache-live")})
    merged = AgentProcess(root / "merged.log", {
        **common, "ADAPTERPLANE_AGENT_NAME": f"{namespace}-merged",
        "ADAPTERPLANE_AGENT_MODEL_DIR": str(root / "absent"),
        "ADAPTERPLANE_AGENT_BASE_RELEASE": str(merge["merged_base"]),
        "ADAPTERPLANE_AGENT_CACHE_DIR": str(root / "cache-merged")})
    router = RouterProcess(root / "router.log", {
        "ADAPTERPLANE_ROUTER_CONTROL_PLANE_URL": deployment.cp.url,
        "ADAPTERPLANE_ROUTER_TOKEN": router_token})
    try:
        for process in (live, merged, router):
            process.start()
        yield Release(deployment, namespace, "support", h_base, artifact, merge,
                      GreedyReference(base, {"support": adapter}), live, merged, router, reader,
                      root, common)
    finally:
        for process in (router, merged, live):
            process.stop()


def prompt(seed: int) -> list[int]:
    return [3 + (seed * 29 + k * 13) % 250 for k in range(5 + seed % 4)]


def complete(client: openai.OpenAI, model: str, p: list[int], n: int = MAX_TOKENS) -> Any:
    return client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})


def _tokens_and_binding(r: Release, p: list[int]) -> tuple[list[int], dict[str, Any]]:
    got = complete(r.client(r.router.url), r.model, p)
    return got.choices[0].model_extra["token_ids"], got.model_extra["adapterplane"]


def test_alias_moves_to_the_release_and_back_with_the_same_tokens(release: Release) -> None:
    r = release
    prompts = [prompt(i) for i in range(3)]
    expected = [r.reference.greedy(p, MAX_TOKENS, "support") for p in prompts]
    r.wait_router_at(1)
    for p, want in zip(prompts, expected, strict=True):
        tokens, binding = _tokens_and_binding(r, p)
        assert tokens == want
        assert binding["generation"] == 1
        assert binding["artifact_digest"] == r.artifact["digest"]

    published = r.catalog("publish", release=str(r.merge["id"]), expected_generation=1)
    assert published == 2
    r.wait_router_at(2)
    for p, want in zip(prompts, expected, strict=True):
        tokens, binding = _tokens_and_binding(r, p)
        assert tokens == want
        assert binding == {"namespace": r.namespace, "alias": r.alias, "generation": 2,
                           "release_digest": r.merge["digest"], "base": r.merge["merged_base"]}
    merged_state = httpx.get(f"{r.merged.url}/v1/agent/state",
                             headers={"Authorization": f"Bearer {r.dep.agent_token}"}).json()
    assert merged_state["slots"] == []  # served as a base: no adapter was ever loaded

    assert r.catalog("rollback", expected_generation=2) == 3
    r.wait_router_at(3)
    for p, want in zip(prompts, expected, strict=True):
        tokens, binding = _tokens_and_binding(r, p)
        assert tokens == want
        assert (binding["generation"], binding["artifact_digest"]) == (3, r.artifact["digest"])


def test_an_agent_never_answers_a_generation_of_another_base(release: Release) -> None:
    r = release
    gens = r.dep.admin.call("GET", f"/v1/namespaces/{r.namespace}/aliases/{r.alias}/history")
    by_kind = {("release" if g["release"] else "artifact"): g["generation"]
               for g in gens["items"] if g["release"] or g["artifact"]}
    for agent, kind in ((r.live, "release"), (r.merged, "artifact")):
        with pytest.raises(openai.APIStatusError) as refused:
            complete(r.client(agent.url), f"{r.model}@{by_kind[kind]}", prompt(0))
        assert refused.value.status_code == 421
        assert refused.value.response.json()["error"]["code"] == "WRONG_BASE"


def test_history_and_resolution_name_the_release(release: Release) -> None:
    r = release
    admin = r.dep.admin
    gens = admin.call("GET", f"/v1/namespaces/{r.namespace}/aliases/{r.alias}/history")
    release_gens = [g for g in gens["items"] if g["release"] is not None]
    assert release_gens and all(g["artifact"] is None for g in release_gens)
    assert release_gens[0]["release"] == {"id": r.merge["id"], "name": "support-merged",
                                          "digest": r.merge["digest"],
                                          "base": r.merge["merged_base"]}
    checkpoint = admin.call("GET", f"/v1/bases/{r.merge['merged_base']}/checkpoint")
    assert set(checkpoint["files"]) == set(r.merge["files"])
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(checkpoint["files"])
    missing = admin.http.get(f"/v1/bases/{r.h_base}/checkpoint")
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")


def _assign(r: Release, name: str, *args: str) -> dict[str, Any]:
    env = {"ADAPTERPLANE_URL": r.dep.cp.url, "ADAPTERPLANE_TOKEN": r.dep.cp.token()}
    result = CliRunner().invoke(app, ["-o", "json", "agents", "assign", name, *args, "--wait",
                                      "--timeout", "120"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _ready(agent: AgentProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{agent.url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"agent not ready again:\n{agent.tail()}"
        time.sleep(0.1)


def test_placement_moves_an_agent_onto_the_release_and_back(release: Release) -> None:
    r = release
    gens = r.dep.admin.call("GET", f"/v1/namespaces/{r.namespace}/aliases/{r.alias}/history")
    of = {("release" if g["release"] else "artifact"): g["generation"]
          for g in reversed(gens["items"]) if g["release"] or g["artifact"]}
    if "release" not in of:  # run alone: give the alias a release generation
        of["release"] = r.catalog("publish", release=str(r.merge["id"]))
    name = f"{r.namespace}-moving"
    mover = AgentProcess(r.root / "moving.log", {
        **r.common_env, "ADAPTERPLANE_AGENT_NAME": name,
        "ADAPTERPLANE_AGENT_CACHE_DIR": str(r.root / "cache-moving")})
    mover.start()
    try:
        assert mover.proc is not None
        pid = mover.proc.pid
        p = prompt(7)
        want = r.reference.greedy(p, MAX_TOKENS, "support")

        moved = _assign(r, name, "--release", f"{r.namespace}/{r.merge['id']}")
        assert moved["base"] == r.merge["merged_base"] and moved["state"] == "live"
        assert moved["release"]["base"] == r.merge["merged_base"]
        assert mover.proc.poll() is None and mover.proc.pid == pid  # re-executed in place
        _ready(mover)
        got = complete(r.client(mover.url), f"{r.model}@{of['release']}", p)
        assert got.choices[0].model_extra["token_ids"] == want
        assert got.model_extra["adapterplane"]["release_digest"] == r.merge["digest"]
        assert mover.state()["slots"] == []
        with pytest.raises(openai.APIStatusError) as refused:
            complete(r.client(mover.url), f"{r.model}@{of['artifact']}", p)
        assert refused.value.response.json()["error"]["code"] == "WRONG_BASE"

        back = _assign(r, name, "--clear")
        assert back["base"] == r.h_base and back["release"] is None
        assert back["worker_epoch"] == moved["worker_epoch"] + 1
        assert mover.proc.poll() is None
        _ready(mover)
        got = complete(r.client(mover.url), f"{r.model}@{of['artifact']}", p)
        assert got.choices[0].model_extra["token_ids"] == want
        assert got.model_extra["adapterplane"]["artifact_digest"] == r.artifact["digest"]
    finally:
        mover.stop()
