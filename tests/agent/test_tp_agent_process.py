"""A TP=2 agent as a real process (CPU, gloo): it serves the HF + PEFT reference tokens
through its two ranks, and when its follower rank dies it stops serving and exits with
status 70 at once, instead of hanging in its next collective until the group's timeout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from agent.daemon import EXIT_TP_RANK_LOST

from .assets import GreedyReference
from .conftest import Deployment, extra_agent
from .test_inference_api import MAX_TOKENS, prompts


def test_tp_agent_serves_then_exits_when_a_rank_dies(
        deployment: Deployment, reference: GreedyReference,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {"ADAPTERPLANE_AGENT_TP_DEGREE": "2",
           "ADAPTERPLANE_AGENT_DEVICE": "cpu", "ADAPTERPLANE_AGENT_LORA_FOLD": "on"}
    with extra_agent(deployment, tmp_path_factory, "agent-tp", env) as agent:
        state = agent.state()
        [follower] = state["tp_follower_pids"]
        assert state["lora_fold_rows"] > 0  # decode steps fold the LoRA on both ranks
        api = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=deployment.reader_token,
                            max_retries=0, timeout=60.0)
        for name in ("a", None):
            [prompt] = prompts(1, seed=41)
            model = f"{deployment.namespace}/{name}" if name else state["served_model_name"]
            res = api.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                         temperature=0, extra_body={"ignore_eos": True})
            assert res.choices[0].model_extra["token_ids"] == \
                reference.greedy(prompt, MAX_TOKENS, name)
        # adapter "a" is published on both ranks, each with its own H_kernel_local
        a_digest = deployment.artifacts["a"]["digest"]
        [slot] = [e for e in agent.state()["slots"]
                  if e["slot"] is not None and e["artifact_digest"] == a_digest]
        assert len(slot["kernel_local"]) == 2 and len(set(slot["kernel_local"])) == 2
        assert all(len(d) == 64 and int(d, 16) for d in slot["kernel_local"])
        # the ledger on /metrics: base all-reduces, the plans' broadcasts, no LoRA call
        metrics = httpx.get(f"{agent.url}/metrics", timeout=10).text
        base = [line for line in metrics.splitlines() if line.startswith(
            'adapter_tp_collective_calls_total{kind="all_reduce",purpose="base"}')]
        assert base and float(base[0].split()[-1]) > 0, metrics
        assert 'purpose="control"' in metrics and 'purpose="lora"' not in metrics
        # the fold holds min(max_slots, max_num_seqs) adapters; serving "a" copied it in
        fold = {line.split()[0]: float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("adapter_lora_fold_")}
        assert fold["adapter_lora_fold_slots"] > 0, metrics
        assert fold["adapter_lora_fold_copies_total"] >= 1, metrics
        assert 0 < fold["adapter_lora_fold_capacity"] <= fold["adapter_lora_fold_slots"]
        assert any(line.startswith("adapter_lora_fold_width_steps_total{width=")
                   and float(line.split()[-1]) >= 1 for line in metrics.splitlines()), metrics
        assert agent.proc is not None
        killed = time.monotonic()
        os.kill(follower, signal.SIGKILL)
        code = agent.proc.wait(timeout=30)
        assert code == EXIT_TP_RANK_LOST, agent.tail()
        assert time.monotonic() - killed < 30
        assert f"TP rank 1 (pid {follower}) exited with code -9" in agent.tail(80)


def test_tp_followers_do_not_outlive_a_killed_agent(
        deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGKILL of the agent (rank 0): its follower ranks end too, not orphaned holding a
    GPU and its memory until a collective times out."""
    env = {"ADAPTERPLANE_AGENT_TP_DEGREE": "2",
           "ADAPTERPLANE_AGENT_DEVICE": "cpu"}
    with extra_agent(deployment, tmp_path_factory, "agent-tp-orphan", env) as agent:
        [follower] = agent.state()["tp_follower_pids"]
        assert agent.proc is not None
        agent.proc.kill()
        agent.proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(follower) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(follower), "the follower outlived its agent"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited (its parent is gone, init reaps it)
