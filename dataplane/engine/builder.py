"""`build_engine`: the one way to construct an `Engine`.

Every caller (the agent, the benchmarks, the tests) builds its engine here, so the order
of construction is fixed in one place (docs/ARCHITECTURE.md, "Building an engine"):

1. the base: a model directory (config.json + safetensors, tokenizer.json when present) is
   loaded and its identity H_base derived from the files, or an already loaded
   :class:`BaseModel` (random-weight benchmarks) is taken as is; a tensor-parallel rank
   loads the global checkpoint on the CPU and keeps its shard;
2. the engine: its unified pool (KV blocks and adapter factors in one buffer), runner,
   scheduler; the projections point at the pool's address tables;
3. the LoRA fold, decided by the fold cost model unless the spec says `on` / `off`;
4. CUDA graphs, captured last (they record the pool's table addresses).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dataplane.artifacts import BaseModelABI, read_base_abi
from dataplane.core import InvalidRequest
from dataplane.engine.config import EngineConfig
from dataplane.engine.engine import Engine
from dataplane.models import load_model
from dataplane.models.config import ModelConfig
from dataplane.models.llama import LlamaForCausalLM
from dataplane.pool.faults import FaultInjector
from dataplane.tokenizer import Tokenizer

if TYPE_CHECKING:
    from dataplane.parallel.collectives import TPGroup

log = logging.getLogger("adapterplane.engine")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FOLD_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class BaseModel:
    """A loaded base: the model, its identity H_base, its ABI (None: PEFT directories
    cannot be validated, only pre-loaded adapters served) and tokenizer (None: token ids
    only)."""

    model: LlamaForCausalLM
    h_base: str
    abi: BaseModelABI | None = None
    tokenizer: Tokenizer | None = None


@dataclass(frozen=True)
class EngineSpec:
    """What to build. `source`: a model directory or a loaded :class:`BaseModel`.

    `lora_fold`: "auto" (the fold cost model decides for this device and these sizes),
    "on" or "off". `tp_group`: this process's tensor-parallel group (None: one device).
    `faults` injects failures into the pool's load transactions (tests).
    `extra_resident_bytes`: a per-rank budget the fold's copies of the factors and the
    factors a TP rank replicates must fit (None: no budget)."""

    source: str | Path | BaseModel
    config: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    dtype: str = "float32"
    device: str = "cpu"
    lora_fold: str = "auto"
    tp_group: TPGroup | None = None
    faults: FaultInjector | None = None
    extra_resident_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidRequest(f"dtype must be one of {sorted(DTYPES)}", dtype=self.dtype)
        if self.lora_fold not in FOLD_CHOICES:
            raise InvalidRequest(f"lora_fold must be one of {FOLD_CHOICES}",
                                 lora_fold=self.lora_fold)

    @classmethod
    def of(cls, source: str | Path | BaseModel, *, dtype: str = "float32",
           device: str = "cpu", lora_fold: str | bool = "auto", **sizes: object
           ) -> EngineSpec:
        """A spec from `EngineConfig` field values (unknown names are refused);
        `lora_fold` may also be a bool (on / off)."""
        unknown = set(sizes) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise InvalidRequest(f"unknown engine options {sorted(unknown)}")
        fold = lora_fold if isinstance(lora_fold, str) else "on" if lora_fold else "off"
        return cls(source, EngineConfig(**sizes),  # type: ignore[arg-type]
                   dtype=dtype, device=device, lora_fold=fold)


def load_base(model_dir: str | Path, dtype: str = "float32", device: str = "cpu"
              ) -> BaseModel:
    """Load config.json + safetensors (+ tokenizer.json) and derive H_base from them."""
    if dtype not in DTYPES:
        raise InvalidRequest(f"dtype must be one of {sorted(DTYPES)}", dtype=dtype)
    path = Path(model_dir)
    model = load_model(path, DTYPES[dtype], torch.device(device))
    abi = read_base_abi(path)
    tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else None
    return BaseModel(model, abi.h_base, abi, tokenizer)


def model_config(model_dir: str | Path) -> ModelConfig:
    """The model's config.json, without loading weights."""
    return ModelConfig.from_model_dir(Path(model_dir))


def build_engine(spec: EngineSpec) -> Engine:
    """The engine `spec` describes (module docstring for the order of construction)."""
    if spec.tp_group is not None:
        return _build_tp_rank(spec)
    base = (spec.source if isinstance(spec.source, BaseModel)
            else load_base(spec.source, spec.dtype, spec.device))
    config = dataclasses.replace(spec.config,
                                 lora_fold=decide_lora_fold(spec, base.model, tp_size=1))
    return Engine(base.model, config, base.h_base, base.abi, base.tokenizer,
                  faults=spec.faults)


def decide_lora_fold(spec: EngineSpec, model: LlamaForCausalLM, tp_size: int) -> bool:
    """`spec.lora_fold`, or with "auto" the fold cost model's decision for this device
    (dataplane/parallel/fold_cost.py)."""
    config = spec.config
    if spec.lora_fold != "auto":
        return spec.lora_fold == "on"
    if config.max_slots == 0 or config.max_rank == 0:
        return False
    from dataplane.parallel.fold_cost import decide_fold

    decision = decide_fold(model.global_config, tp_size,
                           rank=config.max_rank, max_slots=config.max_slots,
                           max_num_seqs=config.max_num_seqs,
                           device=model.embed_tokens.weight.device.type,
                           dtype_bytes=model.dtype.itemsize,
                           extra_resident_budget_bytes=spec.extra_resident_bytes)
    log.info("LoRA fold: %s (%s)", "on" if decision.fold else "off", decision.reason)
    return decision.fold


def _build_tp_rank(spec: EngineSpec) -> Engine:
    """This rank's engine of a tensor-parallel group: the global checkpoint loaded on the
    CPU, this rank's shard kept on the group's device (dataplane/parallel/shard_model.py).
    Every rank calls this with the same spec at the same point."""
    from dataplane.parallel.shard_model import shard_model

    group = spec.tp_group
    assert group is not None
    if isinstance(spec.source, BaseModel):
        raise InvalidRequest("a tensor-parallel rank loads its shard from a model directory")
    base = load_base(spec.source, spec.dtype, "cpu")
    model = shard_model(base.model, group)
    config = dataclasses.replace(spec.config,
                                 lora_fold=decide_lora_fold(spec, model, group.size))
    return Engine(model, config, base.h_base, base.abi, base.tokenizer, faults=spec.faults)
