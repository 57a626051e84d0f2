"""Register a PEFT LoRA directory into an engine slot.

An adapter is read into per-(layer, module) factors `A [r, d_in]`, `B [d_out, r]` (PEFT's
`lora_A.weight` / `lora_B.weight` as stored) and the exact PEFT scale: `alpha / r`, or
`alpha / sqrt(r)` with rsLoRA, with r and alpha taken per module from `rank_pattern` /
`alpha_pattern` (PEFT's `get_pattern_key` rule: the first pattern key `k` whose regex
`(.*\\.)?(k)$` matches the module name). Factors are then written into the runner's
per-(layer, fused projection) `LoraFactorTable`s at one slot: a module the adapter does not
target gets rank 0 (exact zero delta). Loading validates everything before writing.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open

from dataplane.core import EngineError, Sequence
from dataplane.kernels import LoraFactorTable
from dataplane.models.config import ModelConfig
from dataplane.models.llama import LORA_GROUPS

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])\.weight$")

_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


class ModelRunnerLike(Protocol):
    """What the registry needs from the ModelRunner (avoids an import cycle)."""

    config: ModelConfig
    max_slots: int
    max_rank: int
    tables: dict[tuple[int, str], LoraFactorTable]


class AdapterError(EngineError):
    """The PEFT directory is unreadable, not LoRA, or does not fit the base model/slots."""

    code = "ADAPTER_INVALID"


@dataclass(frozen=True)
class ModuleFactors:
    """One adapted projection: PEFT module name, layer, factors and semantic scale."""

    layer: int
    module: str
    a: torch.Tensor  # [r, d_in]
    b: torch.Tensor  # [d_out, r]
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class LoadedAdapter:
    """All factors of one adapter plus its content digest (sha256, hex)."""

    modules: tuple[ModuleFactors, ...]
    digest: str

    @property
    def max_rank(self) -> int:
        return max((m.rank for m in self.modules), default=0)


def _pattern_value(patterns: dict[str, Any], module_key: str, default: Any) -> Any:
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module_key):
            return patterns[key]
    return default


def read_peft_dir(peft_dir: Path, config: ModelConfig) -> LoadedAdapter:
    """Read and check a PEFT LoRA directory against `config`. Raises AdapterError."""
    peft_dir = Path(peft_dir)
    try:
        raw = json.loads((peft_dir / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"cannot read {CONFIG_FILE}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError("only LoRA adapters are supported", peft_type=raw.get("peft_type"))
    for flag in ("use_dora", "alora_invocation_tokens"):
        if raw.get(flag):
            raise AdapterError(f"{flag} is not supported")
    r_default, alpha_default = raw.get("r", 8), raw.get("lora_alpha", 8)
    rank_pattern, alpha_pattern = raw.get("rank_pattern") or {}, raw.get("alpha_pattern") or {}
    rslora = bool(raw.get("use_rslora", False))
    tensors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    hasher = hashlib.sha256()
    try:
        with safe_open(str(peft_dir / WEIGHTS_FILE), framework="pt", device="cpu") as handle:
            for name in sorted(handle.keys()):
                match = _KEY.match(name)
                if match is None:
                    raise AdapterError(f"unsupported adapter tensor {name!r}")
                layer, module, which = int(match.group(1)), match.group(2), match.group(3)
                tensor = handle.get_tensor(name)
                hasher.update(name.encode() + str(tuple(tensor.shape)).encode()
                              + tensor.to(torch.float32).contiguous().numpy().tobytes())
                tensors.setdefault((layer, module), {})[which] = tensor
    except (OSError, RuntimeError, ValueError) as exc:
        raise AdapterError(f"cannot read {WEIGHTS_FILE}: {exc}") from exc
    modules = []
    shapes = config.module_shapes
    for (layer, module), pair in sorted(tensors.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"layer {layer} {module}: needs both lora_A and lora_B")
        if not 0 <= layer < config.num_layers:
            raise AdapterError(f"layer {layer} outside the base model")
        a, b = pair["A"], pair["B"]
        d_out, d_in = shapes[module]
        r = a.shape[0]
        key = f"model.layers.{layer}.{_PARENT[module]}.{module}"
        rank = int(_pattern_value(rank_pattern, key, r_default))
        alpha = float(_pattern_value(alpha_pattern, key, alpha_default))
        if tuple(a.shape) != (rank, d_in) or tuple(b.shape) != (d_out, rank) or r <= 0:
            raise AdapterError(f"layer {layer} {module}: A {list(a.shape)} B {list(b.shape)} "
                               f"do not match rank {rank} and base shape ({d_out}, {d_in})")
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        modules.append(ModuleFactors(layer, module, a, b, scale))
    if not modules:
        raise AdapterError("adapter has no LoRA tensors")
    canonical = {k: raw.get(k) for k in ("r", "lora_alpha", "rank_pattern", "alpha_pattern",
                                           "use_rslora", "target_modules")}
    hasher.update(json.dumps(canonical, sort_keys=True, default=str).encode())
    return LoadedAdapter(tuple(modules), hasher.hexdigest())


def write_adapter_to_slot(tables: dict[tuple[int, str], LoraFactorTable], slot: int,
                          adapter: LoadedAdapter | None, max_rank: int) -> None:
    """Write `adapter` (None = clear) into `slot` of every (layer, fused projection) table."""
    if adapter is not None and adapter.max_rank > max_rank:
        raise AdapterError(f"adapter rank {adapter.max_rank} exceeds max_rank {max_rank}")
    by_key: dict[tuple[int, str], ModuleFactors] = {}
    for m in adapter.modules if adapter is not None else ():
        by_key[(m.layer, m.module)] = m
    for (layer, attr), table in tables.items():
        factors = {}
        for k, module in enumerate(LORA_GROUPS[attr]):
            found = by_key.get((layer, module))
            if found is not None:
                factors[k] = (found.a, found.b, found.scale)
        if factors:
            table.set_slot(slot, factors)
        else:
            table.clear_slot(slot)


@dataclass(frozen=True)
class AdapterHandle:
    """A registered adapter: its slot, semantic digest and the slot's load generation."""

    slot: int
    digest: str
    slot_generation: int
    max_rank: int
    source: str


class AdapterRegistry:
    """Which adapter occupies which slot of a ModelRunner's factor tables.

    The same content (digest) registered twice returns the existing handle. A handle is
    valid while its slot still holds the same load generation.
    """

    def __init__(self, runner: ModelRunnerLike) -> None:
        self.runner = runner
        self._by_slot: dict[int, AdapterHandle] = {}
        self._generations: dict[int, int] = {}

    def register(self, peft_dir: Path) -> AdapterHandle:
        if self.runner.max_slots == 0:
            raise AdapterError("this engine has LoRA disabled (max_slots=0)")
        adapter = read_peft_dir(peft_dir, self.runner.config)
        for handle in self._by_slot.values():
            if handle.digest == adapter.digest:
                return handle
        free = [s for s in range(self.runner.max_slots) if s not in self._by_slot]
        if not free:
            raise AdapterError("no free adapter slot", max_slots=self.runner.max_slots)
        slot = free[0]
        write_adapter_to_slot(self.runner.tables, slot, adapter, self.runner.max_rank)
        generation = self._generations.get(slot, 0) + 1
        self._generations[slot] = generation
        handle = AdapterHandle(slot, adapter.digest, generation, adapter.max_rank,
                               str(peft_dir))
        self._by_slot[slot] = handle
        return handle

    def check_handle(self, handle: AdapterHandle) -> None:
        if self._by_slot.get(handle.slot) != handle:
            raise AdapterError("adapter handle is not registered (stale or foreign)",
                               slot=handle.slot)

    def unregister(self, handle: AdapterHandle, in_use: bool) -> None:
        self.check_handle(handle)
        if in_use:
            raise AdapterError("adapter is used by live requests", slot=handle.slot)
        write_adapter_to_slot(self.runner.tables, handle.slot, None, self.runner.max_rank)
        del self._by_slot[handle.slot]

    def is_ready(self, seq: Sequence) -> bool:
        """Scheduler predicate: base rows, or the slot holds the digest the request bound."""
        if seq.adapter_slot < 0:
            return True
        handle = self._by_slot.get(seq.adapter_slot)
        return handle is not None and handle.digest == seq.adapter_digest

