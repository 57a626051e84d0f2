"""lm-evaluation-harness against a real agent: its `local-completions` model (batched
token-id or text prompts with `echo: true, max_tokens: 1, logprobs: 1` for loglikelihood;
`stop`, `max_tokens`, `seed` for generate_until) on an adapter alias must score two local
tasks exactly as lm-eval's own `hf` backend does on HF transformers + PEFT (fp32, CPU):
the same metrics, the same per-sample loglikelihoods (1e-4) and greedy flags (lm-eval reads
them from `top_logprobs`) and the same generations.
The `hf` backend without the adapter scores differently, so serving the base model in
place of the adapter would fail the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import AgentAssets, Deployment

TOL = 1e-4
CHOICE_DOCS: list[dict[str, Any]] = [  # target_delimiter "": the question ends the context
    {"question": "The sky is ", "choices": ["blue", "green", "a loud noise"], "answer": 0},
    {"question": "Two plus two is ", "choices": ["four", "five", "twenty-two"], "answer": 0},
    {"question": "Water freezes at ", "choices": ["zero degrees", "boiling", "noon"], "answer": 0},
    {"question": "Cats say ", "choices": ["woof", "meow", "moo"], "answer": 1},
    {"question": "The sun rises in the ", "choices": ["west", "east", "north"], "answer": 1},
    {"question": "Fish live in ", "choices": ["trees", "water", "sand"], "answer": 1},
    {"question": "A week has ", "choices": ["five days", "six days", "seven days"], "answer": 2},
    {"question": "Snow is ", "choices": ["hot", "loud", "cold"], "answer": 2},
    # "xU" is the tiny model's greedy continuation here, so one is_greedy flag is true
    {"question": "Q: capital of France?\nA:", "choices": ["xU", " Paris"], "answer": 0},
]
GEN_DOCS: list[dict[str, str]] = [
    # the first target is what the tiny random model (with or without alias a's adapter)
    # generates up to its first "=" (a stop string): exact_match then sees a hit, not only misses
    {"prompt": "Q: capital of France?\nA:", "target": "xU"},
    {"prompt": "Q: 3 + 4?\nA:", "target": " 7"},
    {"prompt": "Q: opposite of up?\nA:", "target": " down"},
    {"prompt": "Q: colour of grass?\nA:", "target": " green"},
]
CHOICE_TASK = """\
task: ap_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""
GEN_TASK = """\
task: ap_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n", "="]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""
TASKS = ["ap_choice", "ap_gen"]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The two tasks as YAML + JSONL in a folder for `TaskManager(include_path=...)`, with
    the Hugging Face caches in the same tmp tree and the hub switched off."""
    root = tmp_path_factory.mktemp("lm-eval")
    for name, docs, template in (("choice", CHOICE_DOCS, CHOICE_TASK),
                                 ("gen", GEN_DOCS, GEN_TASK)):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (root / f"{name}.yaml").write_text(template.format(data=data))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_CACHE", str(root / "datasets-cache"))
        yield root


def _evaluate(task_dir: Path, model: str, model_args: dict[str, Any],
              batch_size: int = 1) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=TASKS, batch_size=batch_size,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        log_samples=True, bootstrap_iters=0, random_seed=0)
    assert out is not None
    return out


def _agent_args(dep: Deployment, assets: AgentAssets, **extra: Any) -> dict[str, Any]:
    return {"base_url": f"{dep.agent.url}/v1/completions", "model": f"{dep.namespace}/a",
            "tokenizer_backend": "huggingface", "tokenizer": str(assets.base),
            "num_concurrent": 1, "max_retries": 1, **extra}


def _metrics(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    keep = ("acc,none", "acc_norm,none", "exact_match,none")
    return {t: {k: v for k, v in out["results"][t].items() if k in keep} for t in TASKS}


def _scores(out: dict[str, Any]) -> list[tuple[float, bool]]:
    """Per doc, per choice, in doc order: (summed continuation logprob, is_greedy)."""
    samples = sorted(out["samples"]["ap_choice"], key=lambda s: s["doc_id"])
    return [(float(r[0]), bool(r[1])) for s in samples for r in s["filtered_resps"]]


def _loglikelihoods(out: dict[str, Any]) -> list[float]:
    return [ll for ll, _ in _scores(out)]


def _generations(out: dict[str, Any]) -> list[str]:
    samples = sorted(out["samples"]["ap_gen"], key=lambda s: s["doc_id"])
    return [s["filtered_resps"][0] for s in samples]


@pytest.fixture(scope="module")
def hf_runs(task_dir: Path, agent_assets: AgentAssets) -> dict[str, dict[str, Any]]:
    """lm-eval's own `hf` backend with alias a's adapter (`peft`) and without it."""
    args = {"pretrained": str(agent_assets.base), "dtype": "float32", "device": "cpu"}
    return {"peft": _evaluate(task_dir, "hf", {**args, "peft": str(agent_assets.adapters["a"])}),
            "base": _evaluate(task_dir, "hf", args)}


def test_the_adapter_changes_what_lm_eval_scores(hf_runs: dict[str, dict[str, Any]]) -> None:
    peft, base = (_loglikelihoods(hf_runs[k]) for k in ("peft", "base"))
    assert len(peft) == sum(len(d["choices"]) for d in CHOICE_DOCS)
    assert any(greedy for _, greedy in _scores(hf_runs["peft"]))
    assert max(abs(p - b) for p, b in zip(peft, base, strict=True)) > 1e-3


@pytest.mark.parametrize(("batch_size", "tokenized"), [(1, True), (4, True), (4, False)],
                         ids=["ids", "ids-batched", "text-batched"])
def test_local_completions_equals_the_hf_peft_backend(
        deployment: Deployment, agent_assets: AgentAssets, task_dir: Path,
        hf_runs: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
        batch_size: int, tokenized: bool) -> None:
    """`tokenized`: prompts as token-id lists (one list per prompt of a batch), else as
    text (the agent tokenizes; lm-eval still counts the context with its own tokenizer)."""
    monkeypatch.setenv("OPENAI_API_KEY", deployment.reader_token)
    served = _evaluate(task_dir, "local-completions", _agent_args(
        deployment, agent_assets, tokenized_requests=tokenized), batch_size=batch_size)
    want = hf_runs["peft"]
    assert _metrics(served) == _metrics(want)
    assert _metrics(want)["ap_gen"]["exact_match,none"] == 1 / len(GEN_DOCS)
    got_ll, want_ll = _loglikelihoods(served), _loglikelihoods(want)
    assert len(got_ll) == len(want_ll)
    assert max(abs(g - w) for g, w in zip(got_ll, want_ll, strict=True)) < TOL
    assert [g for _, g in _scores(served)] == [g for _, g in _scores(want)]
    assert _generations(served) == _generations(want)
