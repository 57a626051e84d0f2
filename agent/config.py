"""Agent settings, read from the environment with the prefix `ADAPTERPLANE_AGENT_`.

One agent serves one base model on one device. Everything it knows about adapters
comes from the control plane (`control_plane_url`, authenticated with an agent token);
its only local state is a content-addressed download cache under `cache_dir`, which a
restart re-verifies rather than trusts.

Fault injection (`fault_*`) is off by default; tests use it to stop an agent mid-load.
"""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict


class AgentSettings(BaseSettings):
    """All knobs of one agent process."""

    model_config = SettingsConfigDict(env_prefix="ADAPTERPLANE_AGENT_", extra="ignore",
                                      use_attribute_docstrings=True)

    control_plane_url: str = "http://127.0.0.1:8400"
    """Base URL of the control plane's admin API (registration, heartbeats, desired
    state, token checks)."""
    token: SecretStr = SecretStr("")
    """Agent token (`is_agent`) used for registration, heartbeats and desired state."""
    name: str = "agent-0"
    """Stable agent name; a restart re-registers under it with a fresh worker epoch."""
    model_dir: Path = Path("./model")
    """HF directory of the base model (config.json + safetensors [+ tokenizer])."""
    base_release: str = ""
    """Serve a merged release instead of `model_dir`: the H_base of the base a merge job
    registered (`adapterctl merges show` prints it as `merged base`). The checkpoint is
    downloaded from the registry into `cache_dir/bases/`, every file's SHA-256 checked, and
    the loaded model must re-derive this H_base. Aliases whose generation serves the
    release are answered with no adapter. A release an operator assigns the agent's name
    (`adapterctl agents assign`) takes precedence over this setting."""
    served_model_name: str = ""
    """`model` value that selects the base model alone; default: the name the base was
    registered under on the control plane (the model dir's name while it is not)."""
    device: str = "cpu"
    """torch device of the engine (`cpu`, `cuda`, `cuda:N`); with `tp_degree > 1` rank r
    uses `cuda:(N + r)`."""
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """dtype of the base weights, adapter factors and KV cache."""
    host: str = "127.0.0.1"
    """Address the agent's HTTP server binds."""
    port: int = Field(default=8500, ge=0, le=65535)
    """Port the agent's HTTP server listens on."""
    advertise_url: str = ""
    """URL other processes use to reach this agent; default `http://host:port`."""
    cache_dir: Path = Path("./var/agent-cache")
    """Content-addressed download cache of adapter files (re-verified on restart)."""

    max_slots: int = Field(default=8, ge=1)
    """Adapters resident at once (worst case: `max_rank` on every target module)."""
    max_rank: int = Field(default=16, ge=1)
    """Largest LoRA rank this agent loads (advertised to the control plane)."""
    num_kv_blocks: int = Field(default=512, ge=1)
    """Pages of the unified pool, each one KV block of `block_size` tokens, shared by KV
    blocks and adapter factors. Left unset on the CPU, the pool gets room for `max_slots`
    adapters of `max_rank` on every target on top (host memory), so that resident
    adapters never shrink the 512 KV blocks into preempting running requests."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per KV block (one pool page)."""
    host_tier_mib: int = Field(default=1024, ge=1)
    """Host memory (pinned on a GPU) for the packed images of adapters this agent loaded,
    least recently used evicted first: an adapter evicted from its slot and loaded again
    is copied from its image instead of packed again (its files are still read and
    verified). An 8B rank-16 adapter on all seven projections is 84 MB."""
    max_num_seqs: int = Field(default=32, ge=1)
    """Sequences scheduled in one engine step (decode batch size)."""
    max_num_batched_tokens: int = Field(default=1024, ge=1)
    """Token budget of one engine step (prefill chunks plus decode rows)."""
    scheduling_policy: Literal["fair", "fcfs", "newest_first"] = "fair"
    """Which waiting request the engine admits: `fair` (priority class, then the tenant —
    the alias's namespace — with the least completed weighted service per unit of weight,
    then age; weights and classes come from the control plane), `fcfs` (arrival), or
    `newest_first` (`fair`, but while requests arrive faster than they are admitted the
    newest ones that can still meet their `max_queue_ms` first, at the old ones' expense;
    docs/PERFORMANCE.md measures what that does to goodput)."""
    max_queued_requests: int = Field(default=256, ge=1)
    """Live requests (queued + running) above which new ones get 429 (with Retry-After)."""
    max_tokens_limit: int | None = Field(default=None, ge=1)
    """Largest `max_tokens` one request may ask for (422 naming `max_tokens` above it, as
    above the model's context less the prompt). None: the context is the only bound."""
    max_queue_ms: int | None = Field(default=None, ge=1, le=3_600_000)
    """Default of a request's `max_queue_ms`: a request that has not started this many
    milliseconds after it arrived (adapter load included) gets 503 QUEUE_TIMEOUT with
    Retry-After, and is dropped as soon as the engine estimates it cannot start in time.
    None: requests wait as long as it takes."""
    load_attempts: int = Field(default=2, ge=1, le=10)
    """Attempts one adapter load makes before the requests waiting for it get 503
    ADAPTER_LOAD_FAILED. An attempt that fails (download, copy, validation, publication)
    is rolled back whole; while requests still wait, the next one starts after a short
    backoff (0.1 s, doubling, at most 2 s) under a new attempt id. Waiting requests keep
    their arrival time, so `max_queue_ms` and TTFT include the failed attempts. 1: no
    retry."""
    cold_reserve_after_ms: int = Field(default=200, ge=0, le=3_600_000)
    """A request that has waited this long for its adapter, which is downloaded but finds
    no room in the pool, makes the engine stop admitting new requests until running ones
    have freed the pages its load needs (those already running keep growing into them):
    a steady stream of requests on resident adapters cannot keep a cold adapter from
    loading. 0: at once."""
    tp_degree: int = Field(default=1, ge=1)
    """Tensor-parallel ranks (GPUs of this node) serving the base model; this agent is
    rank 0."""
    tp_lora_extra_resident_bytes: int | None = Field(default=None, ge=0)
    """With `lora_fold=auto`: a per-rank byte budget the fold's copies of the factors (and,
    under TP, the factor each rank replicates) must fit, or the fold stays off. None: no
    budget."""
    lora_fold: Literal["auto", "on", "off"] = "auto"
    """Decode steps fold the LoRA into each projection's base GEMM (every slot's `A` under
    the weight) and its consumer op (RoPE, add-RMSNorm, SiLU·mul): no LoRA launch, one more
    copy of the factors of as many adapters as a decode step can use (per rank), filled
    from the pool's pages. `auto`: on CUDA, unless reading idle fold slots' `A` costs more
    than the launches saved (`dataplane.parallel.fold_cost`); off on the CPU, where it is
    slower than the torch backend's grouped LoRA path (`bench/cpu_serving_step.py`)."""
    piecewise_graphs: bool = True
    """On CUDA: replay mixed (prefill + decode) steps as piecewise CUDA graphs
    (`EngineConfig.enable_piecewise_graphs`; with tp_degree > 1 on every rank)."""
    collection_blocks: int = Field(default=0, ge=0)
    """Serve Compress-then-Serve members natively: basis blocks (one per resident collection
    cluster) in the engine's collection tables; an alias whose artifact is a verified
    member of a fitted collection is served from the shared bases plus its core. 0: off
    (members are ordinary LoRAs). One GPU only. Members take `max_slots` slots of their
    own beside the pool's (they hold no pages)."""
    collection_rank: int = Field(default=32, ge=1)
    """Shared rank R of every basis block (collections fitted at a larger R are served as
    ordinary LoRAs)."""
    adapter_targets: list[str] = Field(default_factory=list)
    """Target roles this agent serves (default: every projection the model adapts)."""

    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    """Seconds between heartbeats (slot states, load failures) to the control plane."""
    long_poll_s: float = Field(default=10.0, gt=0)
    """Longest wait of one desired-state long-poll before it is sent again."""
    auth_cache_s: float = Field(default=5.0, ge=0)
    """How long a token's read permission on a namespace is cached."""
    auth_stale_s: float = Field(default=60.0, ge=0)
    """How long past `auth_cache_s` a cached permission still answers while the control
    plane cannot be reached (stale-while-revalidate); past it such requests get 503
    CONTROL_PLANE_UNAVAILABLE."""
    require_auth: bool = True
    """Inference requests must carry a bearer token with read on the alias's namespace."""

    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM/SIGINT: readiness turns 503 at once and no new connection is accepted;
    requests in flight may finish for this long, then the rest are aborted (streams end
    with an error event) and the process exits."""

    fault_delay_load_s: float = Field(default=0.0, ge=0)
    """Sleep this long inside every adapter load, after download, before the engine copy."""
    fault_step_delay_s: float = Field(default=0.0, ge=0)
    """Sleep this long before every engine step (slows generation to widen races)."""

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"


def settings_usage(settings: type[BaseSettings] | None = None, width: int = 100,
                   command: str = "agent") -> str:
    """`adapterplane agent --help`: every setting as `--name=DEFAULT  description`.

    `settings` is the class described (default `AgentSettings`; `command` names the
    `adapterplane` command it configures). The `--name=DEFAULT`
    column is as wide as its longest entry, so every description starts at one column;
    a description is joined into one paragraph and wrapped under that column.
    """
    cls = settings or AgentSettings
    fields = cls.model_fields
    prefix = str(cls.model_config.get("env_prefix") or "")
    heads = {
        name: f"--{name.replace('_', '-')}={_default_text(info)}" for name, info in fields.items()
    }
    column = 2 + max(len(head) for head in heads.values()) + 2
    lines = [
        f"usage: adapterplane {command} [--SETTING=VALUE ...]",
        "",
        f"settings (environment {prefix}<NAME>, or --name=value):",
    ]
    for name, info in fields.items():
        head = f"  {heads[name]}".ljust(column)
        text = " ".join((info.description or "").split())
        wrapped = textwrap.wrap(text, max(width - len(head), 40), break_on_hyphens=False)
        wrapped = wrapped or [""]
        lines.append((head + wrapped[0]).rstrip())
        lines += [" " * len(head) + rest for rest in wrapped[1:]]
    return "\n".join(lines)


def _default_text(info: FieldInfo) -> str:
    """A field's default as typed on the command line; `(required)` when it has none."""
    if info.is_required():
        return "(required)"
    value: Any = info.get_default(call_default_factory=True)
    if value is None:
        return "(unset)"
    if isinstance(value, SecretStr):
        value = value.get_secret_value() and "(secret)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value) or '""'


def setting_overrides(argv: Sequence[str]) -> dict[str, Any]:
    """`--key=value` arguments as settings overrides (`-` or `_` in keys); exits with a
    message on anything else."""
    overrides: dict[str, Any] = {}
    for arg in argv:
        key, sep, value = arg.removeprefix("--").partition("=")
        if not sep:
            raise SystemExit(f"expected --key=value, got {arg!r}")
        overrides[key.replace("-", "_")] = value
    return overrides


S = TypeVar("S", bound=BaseSettings)


def command_line(settings: type[S], argv: Sequence[str], command: str) -> S | None:
    """What `adapterplane <command> [--key=value ...]` starts with: the settings from the
    environment and `argv`, with logging configured; None after printing `--help`."""
    if any(a in ("-h", "--help") for a in argv):
        print(settings_usage(settings, command=command))
        return None
    overrides = setting_overrides(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request URL at INFO: presigned download URLs carry their signature
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return settings(**overrides)
