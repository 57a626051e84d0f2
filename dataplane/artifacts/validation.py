"""Validate a PEFT LoRA directory against a base ABI and derive its content identity.

Checks run cheapest first, so a corrupt file is refused before any tensor is read:
files (pickle, presence, size) -> config -> safetensors header -> key grammar ->
factor pairing, dtype, rank agreement -> fit to the base -> limits -> config/tensor
agreement -> streamed SHA-256 + finiteness of every factor. Any failure raises
ArtifactRejected with one RejectionCode; nothing is written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dataplane.artifacts.base_abi import PICKLE_SUFFIXES, BaseModelABI
from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.artifacts.json_files import read_json_object
from dataplane.artifacts.peft_config import EMBEDDING_TARGETS, LoraSettings, parse_lora_config
from dataplane.artifacts.safetensors_header import TensorInfo, hash_and_check_finite, read_header
from dataplane.artifacts.validated import ValidatedArtifact
from dataplane.identity import ArtifactIdentity, ModuleSpec

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
FACTOR_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B"}
METHOD_LORA = "lora"


@dataclass(frozen=True)
class ArtifactLimits:
    """What an agent can serve. `max_file_bytes` bounds each file of the artifact."""

    max_rank: int = 128
    max_file_bytes: int = 4 * 1024**3
    allowed_dtypes: frozenset[str] = frozenset({"float32", "float16", "bfloat16"})


def reject(code: RejectionCode, message: str, **detail: object) -> ArtifactRejected:
    return ArtifactRejected(code, message, dict(detail))


def canonical_module_name(key: str) -> tuple[str, str] | None:
    """PEFT tensor key -> (canonical base-module name, "A" | "B"), or None if not a factor.

    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    -> ("model.layers.0.self_attn.q_proj", "A").
    """
    if not key.startswith(PEFT_PREFIX):
        return None
    for suffix, factor in FACTOR_SUFFIXES.items():
        if key.endswith(suffix):
            name = key[len(PEFT_PREFIX):-len(suffix)]
            return (name, factor) if name else None
    return None


def _check_files(adapter_dir: Path, limits: ArtifactLimits) -> Path:
    if not adapter_dir.is_dir():
        raise reject(RejectionCode.MISSING_FILE, f"{adapter_dir.name} is not a directory")
    entries = sorted(adapter_dir.iterdir())
    pickles = [p.name for p in entries if p.name.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise reject(RejectionCode.PICKLE_WEIGHTS, f"pickle weights present: {pickles}",
                     files=pickles)
    weights = adapter_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise reject(RejectionCode.MISSING_FILE, f"{WEIGHTS_FILE} is missing", file=WEIGHTS_FILE)
    for path in entries:
        if path.is_file() and path.stat().st_size > limits.max_file_bytes:
            raise reject(RejectionCode.FILE_TOO_LARGE,
                         f"{path.name} is {path.stat().st_size} bytes",
                         file=path.name, limit=limits.max_file_bytes)
    return weights


def _group_factors(tensors: dict[str, TensorInfo]) -> dict[str, dict[str, TensorInfo]]:
    modules: dict[str, dict[str, TensorInfo]] = {}
    for key in sorted(tensors):
        parsed = canonical_module_name(key)
        if parsed is None:
            if key.endswith(".bias"):
                raise reject(RejectionCode.UNSUPPORTED_FEATURE,
                             f"{key}: trained biases are not supported", key=key)
            raise reject(RejectionCode.UNEXPECTED_KEY, f"{key} is not a LoRA factor", key=key)
        name, factor = parsed
        if name.rsplit(".", 1)[-1] in EMBEDDING_TARGETS:
            raise reject(RejectionCode.UNSUPPORTED_FEATURE,
                         f"{name}: embedding/lm_head targets are not supported", module=name)
        modules.setdefault(name, {})[factor] = tensors[key]
    if not modules:
        raise reject(RejectionCode.MISSING_FACTOR, "the adapter holds no LoRA factors")
    for name, factors in modules.items():
        if set(factors) != {"A", "B"}:
            missing = "B" if "A" in factors else "A"
            raise reject(RejectionCode.MISSING_FACTOR, f"{name} has no lora_{missing}",
                         module=name, missing=f"lora_{missing}")
    return modules


def _check_factor_shapes(name: str, a: TensorInfo, b: TensorInfo,
                         limits: ArtifactLimits) -> int:
    for info in (a, b):
        if info.dtype not in limits.allowed_dtypes:
            raise reject(RejectionCode.UNSUPPORTED_DTYPE, f"{info.name} is {info.dtype}",
                         key=info.name, dtype=info.dtype)
        if len(info.shape) != 2 or 0 in info.shape:
            raise reject(RejectionCode.SHAPE_MISMATCH, f"{info.name} has shape {info.shape}",
                         key=info.name, shape=list(info.shape))
    if a.dtype != b.dtype:
        raise reject(RejectionCode.UNSUPPORTED_DTYPE, f"{name}: A is {a.dtype}, B {b.dtype}",
                     module=name)
    if a.shape[0] != b.shape[1]:
        raise reject(RejectionCode.RANK_MISMATCH,
                     f"{name}: A rank {a.shape[0]} != B rank {b.shape[1]}",
                     module=name, a_rank=a.shape[0], b_rank=b.shape[1])
    return a.shape[0]


def _check_base_fit(modules: dict[str, dict[str, TensorInfo]], base: BaseModelABI) -> None:
    failures: list[ArtifactRejected] = []
    for name, factors in sorted(modules.items()):
        shape = base.module_shapes.get(name)
        a, b = factors["A"], factors["B"]
        if shape is None:
            failures.append(reject(RejectionCode.UNKNOWN_MODULE,
                                   f"base has no module {name}", module=name))
        elif a.shape[1] != shape[1] or b.shape[0] != shape[0]:
            failures.append(reject(
                RejectionCode.SHAPE_MISMATCH,
                f"{name}: A {list(a.shape)} / B {list(b.shape)} do not fit base {list(shape)}",
                module=name, base_shape=list(shape), a_shape=list(a.shape),
                b_shape=list(b.shape)))
    if failures and len(failures) == len(modules):
        raise reject(RejectionCode.WRONG_BASE,
                     f"no adapted module fits base {base.architecture} ({base.h_base[:12]})",
                     h_base=base.h_base, first=failures[0].message)
    if failures:
        raise failures[0]


def _check_config_agreement(modules: dict[str, dict[str, TensorInfo]], settings: LoraSettings,
                            base: BaseModelABI) -> None:
    expected = set(settings.expected_modules(base.module_shapes))
    present = set(modules)
    if expected != present:
        raise reject(RejectionCode.CONFIG_TENSOR_MISMATCH,
                     "target_modules and the tensors present disagree",
                     targeted_without_tensors=sorted(expected - present)[:8],
                     tensors_not_targeted=sorted(present - expected)[:8])
    for name, factors in sorted(modules.items()):
        rank = factors["A"].shape[0]
        if rank != settings.rank_for(name):
            raise reject(RejectionCode.CONFIG_TENSOR_MISMATCH,
                         f"{name}: tensor rank {rank} but config rank {settings.rank_for(name)}",
                         module=name, tensor_rank=rank, config_rank=settings.rank_for(name))


def _check_invocation_tokens(settings: LoraSettings, base: BaseModelABI) -> None:
    """An aLoRA's invocation tokens must be token ids of the base's vocabulary."""
    tokens = settings.invocation_tokens or ()
    outside = [t for t in tokens if t >= base.vocab_size]
    if outside:
        raise reject(RejectionCode.MALFORMED_CONFIG,
                     f"alora_invocation_tokens {outside} are outside the base's vocabulary "
                     f"of {base.vocab_size}", field="alora_invocation_tokens",
                     vocab_size=base.vocab_size)


def validate_peft_dir(adapter_dir: Path, base: BaseModelABI,
                      limits: ArtifactLimits = ArtifactLimits()) -> ValidatedArtifact:
    """Validate the PEFT LoRA adapter in `adapter_dir` for `base`; raise ArtifactRejected."""
    adapter_dir = Path(adapter_dir)
    weights = _check_files(adapter_dir, limits)
    settings = parse_lora_config(read_json_object(adapter_dir / CONFIG_FILE,
                                                  what="adapter config"))
    tensors, _metadata = read_header(weights)
    modules = _group_factors(tensors)
    ranks = {name: _check_factor_shapes(name, f["A"], f["B"], limits)
             for name, f in sorted(modules.items())}
    dtypes = sorted({f["A"].dtype for f in modules.values()})
    if len(dtypes) != 1:
        raise reject(RejectionCode.UNSUPPORTED_DTYPE, f"mixed factor dtypes {dtypes}",
                     dtypes=dtypes)
    _check_base_fit(modules, base)
    for name, rank in ranks.items():
        if rank > limits.max_rank:
            raise reject(RejectionCode.RANK_LIMIT, f"{name}: rank {rank} > {limits.max_rank}",
                         module=name, rank=rank, limit=limits.max_rank)
    _check_config_agreement(modules, settings, base)
    _check_invocation_tokens(settings, base)
    specs = []
    for name, factors in sorted(modules.items()):
        digests = {}
        for factor, info in sorted(factors.items()):
            sha, finite = hash_and_check_finite(weights, info)
            if not finite:
                raise reject(RejectionCode.NON_FINITE, f"{info.name} holds NaN or Inf",
                             key=info.name)
            digests[factor] = sha
        specs.append(ModuleSpec(
            name=name, role=name.rsplit(".", 1)[-1], base_shape=base.module_shapes[name],
            rank=ranks[name], alpha=settings.alpha_for(name),
            scaling_rule=settings.scaling_rule, dtype=dtypes[0],
            a_sha256=digests["A"], b_sha256=digests["B"],
        ))
    identity = ArtifactIdentity(METHOD_LORA, settings.peft_config_sha256, base.h_base,
                                tuple(specs))
    return ValidatedArtifact.from_identity(identity, settings.invocation_tokens)
