"""The fleet through its routers: real processes (control plane, three CPU agents on
their own base model, two routers), the official openai client, HF + PEFT references.

The fleet's agents sleep before every engine step (`fault_step_delay_s`) and inside every
adapter load (`fault_delay_load_s`), so a test can kill an agent while a stream is
running or a load is under way. The session's own agent (`deployment.agent`) serves
another base, so the routers never send these requests to it.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from agent.router.process import RouterProcess
from dataplane.artifacts import read_base_abi
from dataplane.assets import make_peft_adapter, make_tiny_llama

from .assets import GreedyReference, write_byte_tokenizer
from .conftest import Deployment
from .stack import AgentProcess

MAX_TOKENS = 6
BASE_NAME = "fleet-tiny"
"""The base's registered name: what agents serve the bare base model as."""
FLEET_ADAPTERS: dict[str, dict[str, Any]] = {
    "a": dict(seed=21, rank=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    "b": dict(seed=22, rank=8, alpha=16, target_modules=["q_proj", "o_proj", "down_proj"]),
    "c": dict(seed=23, rank=2, alpha=4, target_modules=["gate_proj", "v_proj"]),
    "d": dict(seed=24, rank=4, alpha=8, target_modules=["k_proj", "v_proj"]),
    "e": dict(seed=25, rank=4, alpha=8, target_modules=["q_proj", "up_proj"]),
}
"""a, b, c: published at start; d: the cold burst; e: killed mid-load."""


@dataclass
class Fleet:
    dep: Deployment
    namespace: str
    h_base: str
    base_name: str
    artifacts: dict[str, dict[str, Any]]
    reference: GreedyReference
    agents: list[AgentProcess]
    routers: list[RouterProcess]
    reader: str

    def client(self, url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=self.reader, max_retries=0,
                             timeout=60.0)

    def agent_named(self, name: str) -> AgentProcess:
        return next(a for a in self.agents if a.env["ADAPTERPLANE_AGENT_NAME"] == name)

    def holders(self, digest: str) -> list[str]:
        """Agents with `digest` in a slot now."""
        return [a.env["ADAPTERPLANE_AGENT_NAME"] for a in self.agents
                if a.proc is not None and a.proc.poll() is None
                and any(s["artifact_digest"] == digest for s in a.state()["slots"])]

    def wait_routers_see(self, model: str, timeout_s: float = 10.0) -> None:
        for router in self.routers:
            deadline = time.monotonic() + timeout_s
            while model not in {m.id for m in self.client(router.url).models.list().data}:
                assert time.monotonic() < deadline, f"{router.url} never listed {model}"
                time.sleep(0.05)


@pytest.fixture(scope="module")
def fleet(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    base = make_tiny_llama(root / "fleet-base", seed=11)
    write_byte_tokenizer(base)
    paths = {n: make_peft_adapter(base, root / n, **spec) for n, spec in FLEET_ADAPTERS.items()}
    admin = deployment.admin
    h_base = str(admin.call("POST", "/v1/bases", json={
        "name": BASE_NAME, "abi": read_base_abi(base).to_record()})["h_base"])
    namespace = f"fl-{uuid.uuid4().hex[:8]}"
    admin.call("POST", "/v1/namespaces", json={"name": namespace})
    artifacts = {n: admin.push(namespace, h_base, p) for n, p in paths.items()}
    for name in ("a", "b", "c"):
        admin.publish(namespace, name, artifacts[name]["id"])
    reader = admin.token("fleet-reader", [{"namespace": namespace, "role": "read"}])
    router_token = admin.token("fleet-router", [{"namespace": "*", "role": "read"}])
    agents = [AgentProcess(root / f"fleet-{i}.log", {
        **deployment.agent_env, "ADAPTERPLANE_AGENT_NAME": f"fleet-{i}",
        "ADAPTERPLANE_AGENT_MODEL_DIR": str(base),
        "ADAPTERPLANE_AGENT_CACHE_DIR": str(root / f"cache-{i}"),
        "ADAPTERPLANE_AGENT_FAULT_STEP_DELAY_S": "0.02",
        "ADAPTERPLANE_AGENT_FAULT_DELAY_LOAD_S": "1.0"}) for i in range(3)]
    routers = [RouterProcess(root / f"router-{i}.log", {
        "ADAPTERPLANE_ROUTER_CONTROL_PLANE_URL": deployment.cp.url,
        "ADAPTERPLANE_ROUTER_TOKEN": router_token}) for i in range(2)]
    reference = GreedyReference(base, paths)
    try:
        for process in (*agents, *routers):
            process.start()
        fleet = Fleet(deployment, namespace, h_base, BASE_NAME, artifacts, reference, agents,
                      routers, reader)
        for name in ("a", "b", "c"):
            fleet.wait_routers_see(f"{namespace}/{name}")
        yield fleet
    finally:
        for process in (*routers, *agents):
            process.stop()
        for name in FLEET_ADAPTERS:
            with contextlib.suppress(AssertionError):  # never published
                admin.retire(namespace, name)


def prompt(seed: int) -> list[int]:
    return [3 + (seed * 37 + k * 11) % 250 for k in range(4 + seed % 5)]


def complete(client: openai.OpenAI, model: str, p: list[int], n: int = MAX_TOKENS) -> Any:
    return client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})


def test_router_answers_equal_a_direct_agent_and_the_reference(fleet: Fleet) -> None:
    ns = fleet.namespace
    direct = fleet.client(fleet.agents[0].url)
    for i, name in enumerate(["a", "b", "c", None]):
        model = f"{ns}/{name}" if name else fleet.base_name
        p = prompt(i)
        expected = fleet.reference.greedy(p, MAX_TOKENS, name)
        assert complete(direct, model, p).choices[0].model_extra["token_ids"] == expected
        for router in fleet.routers:
            res = complete(fleet.client(router.url), model, p)
            assert res.choices[0].model_extra["token_ids"] == expected, (name, router.url)
            binding = res.model_extra["adapterplane"]
            if name is None:
                assert binding is None
            else:  # admitted at the current generation, and forwarded pinned to it
                assert binding["generation"] == 1
                assert binding["artifact_digest"] == fleet.artifacts[name]["digest"]
                assert res.model == f"{ns}/{name}@1"
    # streaming and chat through a router
    router = fleet.client(fleet.routers[0].url)
    p = prompt(7)
    stream = router.completions.create(model=f"{ns}/b", prompt=p, max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    streamed = [t for chunk in stream for c in chunk.choices
                for t in (c.model_extra or {}).get("token_ids") or []]
    assert streamed == fleet.reference.greedy(p, MAX_TOKENS, "b")
    chat = router.chat.completions.create(model=f"{ns}/a", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.model_extra["adapterplane"]["alias"] == "a"


def test_models_lists_what_the_caller_may_read(fleet: Fleet) -> None:
    ns = fleet.namespace
    for router in fleet.routers:
        ids = {m.id for m in fleet.client(router.url).models.list().data}
        assert {f"{ns}/a", f"{ns}/b", f"{ns}/c", fleet.base_name} <= ids
        outsider = openai.OpenAI(base_url=f"{router.url}/v1", max_retries=0,
                                 api_key=fleet.dep.outsider_token)
        assert not {m.id for m in outsider.models.list().data} & {f"{ns}/a", f"{ns}/b"}
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{router.url}/v1", api_key="nope",
                          max_retries=0).models.list()


def test_every_router_metric_is_documented(fleet: Fleet) -> None:
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    doc = (Path(__file__).resolve().parents[2] / "docs" / "METRICS.md").read_text()
    documented = set(re.findall(r"^\| `(adapterplane_router_[a-z_]+)` \|",
                                doc.split("## Router metrics")[1], re.M))
    text = httpx.get(f"{fleet.routers[0].url}/metrics", timeout=10).text
    exported = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(text)
                if f.name.startswith("adapterplane_router_") and not f.name.endswith("_created")}
    assert exported and exported == documented, exported ^ documented


def test_refusals_are_the_agents_error_objects(fleet: Fleet) -> None:
    ns = fleet.namespace
    url = fleet.routers[0].url
    headers = {"Authorization": f"Bearer {fleet.reader}"}
    cases = [({"model": f"{ns}/nope", "prompt": "x"}, 404, "NOT_FOUND"),
             ({"model": "not a model", "prompt": "x"}, 422, "VALIDATION_ERROR"),
             ({"model": f"other-{ns}/a", "prompt": "x"}, 403, "FORBIDDEN"),
             ({"prompt": "x"}, 422, "VALIDATION_ERROR")]
    for body, status, code in cases:
        r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=10)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), body
    r = httpx.post(f"{url}/v1/completions", content=b"{", headers=headers, timeout=10)
    assert r.status_code == 422
    r = httpx.post(f"{url}/v1/completions", json={"model": f"{ns}/a"}, timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "UNAUTHENTICATED")


def test_a_cold_adapter_requested_50_times_at_once_loads_on_one_agent(fleet: Fleet) -> None:
    ns, art = fleet.namespace, fleet.artifacts["d"]
    fleet.dep.admin.publish(ns, "d", art["id"])
    fleet.wait_routers_see(f"{ns}/d")
    clients = [fleet.client(r.url) for r in fleet.routers]
    served: list[str] = []

    def one(i: int) -> Any:
        raw = clients[i % 2].completions.with_raw_response.create(
            model=f"{ns}/d", prompt=prompt(i), max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True})
        served.append(raw.headers["x-adapterplane-agent"])
        return raw.parse()

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50)))
    for i, res in enumerate(results):
        assert res.choices[0].model_extra["token_ids"] == fleet.reference.greedy(
            prompt(i), MAX_TOKENS, "d")
    metrics = [httpx.get(f"{r.url}/metrics").text for r in fleet.routers]
    attempts = [line for m in metrics for line in m.splitlines()
                if line.startswith(("adapterplane_router_attempts_total",
                                    "adapterplane_router_cold_routes_total"))]
    assert len(set(served)) == 1, (sorted(set(served)), served.count(served[0]), attempts)
    assert fleet.holders(art["digest"]) == [served[0]]


def test_republish_mid_load_every_answer_is_its_admitted_generation(fleet: Fleet) -> None:
    ns, admin = fleet.namespace, fleet.dep.admin
    published = {1: "a"}
    stop = threading.Event()
    answers: list[tuple[list[int], Any]] = []
    errors: list[BaseException] = []

    def loop(k: int) -> None:
        client = fleet.client(fleet.routers[k % 2].url)
        i = k * 1000
        while not stop.is_set():
            p = prompt(i)
            try:
                answers.append((p, complete(client, f"{ns}/a", p, 3)))
            except BaseException as exc:  # recorded: the test asserts there are none
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for name in ("c", "a", "b", "a"):
            time.sleep(0.3)
            published[admin.publish(ns, "a", fleet.artifacts[name]["id"])] = name
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    generations = set()
    for p, res in answers:
        binding = res.model_extra["adapterplane"]
        name = published[binding["generation"]]
        generations.add(binding["generation"])
        assert res.model == f"{ns}/a@{binding['generation']}"
        assert binding["artifact_digest"] == fleet.artifacts[name]["digest"]
        assert res.choices[0].model_extra["token_ids"] == fleet.reference.greedy(p, 3, name)
    assert len(generations) >= 3, generations  # the loop really ran across republishes
    admin.publish(ns, "a", fleet.artifacts["a"]["id"])


def _restart(agent: AgentProcess) -> None:
    agent.stop()
    agent.start()


def test_a_client_gone_aborts_its_request_at_the_agent(fleet: Fleet) -> None:
    """Non-streaming and streaming: the router closes the agent's connection when its
    client leaves, and the agent stops generating (200 tokens at >= 20 ms a step would
    run >= 4 s)."""
    router = fleet.routers[0]
    headers = {"Authorization": f"Bearer {fleet.reader}"}
    body = {"model": f"{fleet.namespace}/a", "prompt": [9, 8, 7], "max_tokens": 200,
            "ignore_eos": True}

    def live() -> int:
        return sum(a.state()["live"] for a in fleet.agents)

    for stream in (False, True):
        started = time.monotonic()
        if stream:
            with httpx.stream("POST", f"{router.url}/v1/completions", headers=headers,
                              json={**body, "stream": True}, timeout=30) as r:
                assert r.status_code == 200
                next(r.iter_lines())  # a token has come: the request is running
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{router.url}/v1/completions", headers=headers, json=body,
                           timeout=httpx.Timeout(30, read=0.5))
        while live():
            assert time.monotonic() - started < 2.5, f"stream={stream}: still generating"
            time.sleep(0.05)


def test_kill_9_mid_load_retries_elsewhere(fleet: Fleet) -> None:
    ns, art = fleet.namespace, fleet.artifacts["e"]
    fleet.dep.admin.publish(ns, "e", art["id"])
    fleet.wait_routers_see(f"{ns}/e")
    p = prompt(3)
    result: dict[str, Any] = {}

    def request() -> None:
        with httpx.Client(timeout=60) as http:
            r = http.post(f"{fleet.routers[0].url}/v1/completions",
                          headers={"Authorization": f"Bearer {fleet.reader}"},
                          json={"model": f"{ns}/e", "prompt": p, "max_tokens": MAX_TOKENS,
                                "temperature": 0, "ignore_eos": True})
            result["status"], result["body"] = r.status_code, r.json()
            result["agent"] = r.headers.get("x-adapterplane-agent")

    thread = threading.Thread(target=request)
    thread.start()
    victim = _loading_agent(fleet, art["digest"])
    victim.kill()
    thread.join(timeout=60)
    try:
        assert result["status"] == 200, result
        assert result["agent"] != victim.env["ADAPTERPLANE_AGENT_NAME"]
        assert result["body"]["choices"][0]["token_ids"] == fleet.reference.greedy(
            p, MAX_TOKENS, "e")
    finally:
        victim.start()


def _loading_agent(fleet: Fleet, digest: str, timeout_s: float = 10.0) -> AgentProcess:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for agent in fleet.agents:
            slots = agent.state()["slots"]
            if any(s["artifact_digest"] == digest and s["state"] == "loading"
                   and s["waiting"] > 0 for s in slots):
                return agent
        time.sleep(0.02)
    raise AssertionError("no agent was loading the adapter for a waiting request")


def test_kill_9_mid_stream_ends_with_an_error_event_not_another_agents_tokens(
        fleet: Fleet) -> None:
    ns = fleet.namespace
    p, n = prompt(5), 60
    expected = fleet.reference.greedy(p, n, "b")
    body = {"model": f"{ns}/b", "prompt": p, "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "stream": True}
    tokens: list[int] = []
    events: list[dict[str, Any]] = []
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", f"{fleet.routers[1].url}/v1/completions", json=body,
            headers={"Authorization": f"Bearer {fleet.reader}"}) as r:
        assert r.status_code == 200
        victim = fleet.agent_named(r.headers["x-adapterplane-agent"])
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            events.append(event)
            for choice in event.get("choices", []):
                tokens += choice.get("token_ids") or []
            if len(tokens) >= 5 and victim.proc is not None and victim.proc.poll() is None:
                victim.kill()
    try:
        assert "error" in events[-1] and events[-1]["error"]["code"] == "UPSTREAM_INTERRUPTED"
        assert 5 <= len(tokens) < n and tokens == expected[:len(tokens)]
        # the next request for the alias is served by another agent, in full
        again = complete(fleet.client(fleet.routers[1].url), f"{ns}/b", p)
        assert again.choices[0].model_extra["token_ids"] == expected[:MAX_TOKENS]
    finally:
        victim.start()


def test_kill_9_through_the_openai_client_raises(fleet: Fleet) -> None:
    """The official client turns the error event into an exception (no silent truncation)."""
    ns = fleet.namespace
    client = fleet.client(fleet.routers[0].url)
    stream = client.completions.with_raw_response.create(
        model=f"{ns}/c", prompt=prompt(9), max_tokens=60, temperature=0, stream=True,
        extra_body={"ignore_eos": True})
    victim = fleet.agent_named(stream.headers["x-adapterplane-agent"])
    try:
        with pytest.raises(openai.APIError):
            for k, _chunk in enumerate(stream.parse()):
                if k == 3:
                    victim.kill()
    finally:
        victim.start()




def test_rolling_restart_under_load_fails_no_request(fleet: Fleet) -> None:
    """Drain, wait until drained, restart: each agent in turn, while clients keep sending
    requests through both routers."""
    ns, admin = fleet.namespace, fleet.dep.admin
    stop = threading.Event()
    done: list[str] = []
    errors: list[BaseException] = []

    def loop(k: int) -> None:
        client = fleet.client(fleet.routers[k % 2].url)
        i = 5000 + k * 1000
        while not stop.is_set():
            name = "abc"[i % 3]
            p = prompt(i)
            try:
                raw = client.completions.with_raw_response.create(
                    model=f"{ns}/{name}", prompt=p, max_tokens=3, temperature=0,
                    extra_body={"ignore_eos": True})
                res = raw.parse()
                got = res.choices[0].model_extra["token_ids"]
                if got != fleet.reference.greedy(p, 3, name):
                    others = {o: fleet.reference.greedy(p, 3, o) for o in ("a", "b", "c", None)}
                    raise AssertionError(
                        f"{name} {p} via {raw.headers.get('x-adapterplane-agent')}: {got} "
                        f"binding {res.model_extra['adapterplane']} refs {others}")
                done.append(name)
            except BaseException as exc:  # recorded: the test asserts there are none
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for agent in fleet.agents:
            name = agent.env["ADAPTERPLANE_AGENT_NAME"]
            [row] = admin.call("GET", "/v1/agents", params={"name": name})
            admin.call("POST", f"/v1/agents/{row['id']}/drain")
            deadline = time.monotonic() + 60
            while not admin.call("GET", f"/v1/agents/{row['id']}")["drained"]:
                assert time.monotonic() < deadline, f"{name} never drained"
                time.sleep(0.1)
            before = len(done)
            agent.stop()
            agent.start()
            assert admin.call("GET", f"/v1/agents/{row['id']}")["state"] == "live"
            assert len(done) > before or not errors
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(done) >= 30, len(done)
