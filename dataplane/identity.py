"""Content identities of the serving system (docs/ARCHITECTURE.md, "Identities").

Stdlib + rfc8785 only (and the stdlib-only `dataplane.errors`).

Every digest is SHA-256 (lowercase hex) over RFC 8785 canonical JSON: sorted keys, no
whitespace, integers within ±2^53, and *no floats at all* — scales are exact fractions
(`{"num": 4, "den": 1}`) plus a named scaling rule, so two machines can never disagree
about the last bit of a scale. Paths, URIs, aliases, slot indices never enter content
identities; they enter only the physical bindings that exist to track them.

Layering (each digest covers the ones above it, never the other way round)::

    H_base            weights, config, weight transforms, target-module map
    H_artifact        method, PEFT-config digest, H_base, module specs sorted by name
    H_adapter_semantic  H_base, H_artifact, activation-policy digest
    H_kernel_local    semantic, kernel family, conversion revision, dtype, packing,
                      local module layouts, TP shard
    request binding   namespace, request id, attempt, lineage, H_base, semantic, gen. policy
    slot binding      worker epoch, device, slot index + generation, pointer-table
                      generation, semantic, kernel-local
    cache ABI/prefix  cache ABI (semantic or base digest, KV representation, shard),
                      token ids, side inputs, isolation namespace

Residency accounting (`module_residency`, `residency_ledger`) counts logical factor
scalars/bytes and per-TP-rank local scalars/bytes for a declared sharding.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import rfc8785

from dataplane.errors import EngineError

JSONValue = None | bool | int | str | list["JSONValue"] | dict[str, "JSONValue"]

SCALING_ALPHA_OVER_R = "alpha/r"
SCALING_RSLORA = "alpha/sqrt(r)"
SCALING_RULES = (SCALING_ALPHA_OVER_R, SCALING_RSLORA)
DTYPE_BYTES: Mapping[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
A_AXES = ("rank", "input")
"""Logical axes of A: [r, d_in]."""
B_AXES = ("output", "rank")
"""Logical axes of B: [d_out, r]."""
B_STORED_AXES = ("rank", "output")
"""B as the kernels store it: transposed, rank rows of output columns (dataplane.kernels)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")


class IdentityError(EngineError):
    """A record cannot be given a content identity. `code` (per instance) is stable,
    lowercase; `str(exc)` is `"<code>: <message>"`."""

    code_in_str = True

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def _check_json(value: object, where: str) -> None:
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, float):
        raise IdentityError("float_not_allowed", f"float at {where}; use an exact fraction")
    if isinstance(value, int):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise IdentityError("unsupported_type", f"non-string key {key!r} at {where}")
            _check_json(item, f"{where}.{key}")
        return
    raise IdentityError("unsupported_type", f"{type(value).__name__} at {where}")


def canonical_json(value: object) -> bytes:
    """RFC 8785 bytes of `value` (dict/list/tuple/str/int/bool/None). Floats are refused."""
    _check_json(value, "$")
    try:
        return rfc8785.dumps(value)  # type: ignore[arg-type]
    except rfc8785.IntegerDomainError as exc:
        raise IdentityError("integer_out_of_range", str(exc)) from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: object) -> str:
    """SHA-256 hex of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))


def check_digest(value: object, name: str) -> str:
    """Return `value` if it is a 64-char lowercase SHA-256 hex string, else raise."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise IdentityError("invalid_digest", f"{name} must be 64 lowercase hex chars")
    return value


def check_count(value: object, name: str, *, minimum: int = 0) -> int:
    """Return `value` if it is an int (not bool) >= minimum, else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise IdentityError("invalid_field", f"{name} must be an integer >= {minimum}")
    return value


def check_text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise IdentityError("invalid_field", f"{name} must be a non-empty string")
    return value


def fraction_record(value: Fraction) -> dict[str, JSONValue]:
    """Exact canonical form of a rational: reduced, denominator > 0."""
    return {"num": value.numerator, "den": value.denominator}


# --------------------------------------------------------------------------- base


@dataclass(frozen=True)
class BaseIdentity:
    """Inputs of H_base. Model names and URLs are provenance, never part of it."""

    weights_sha256: str
    config_sha256: str
    transforms_sha256: str
    target_map_sha256: str

    def __post_init__(self) -> None:
        for name in ("weights_sha256", "config_sha256", "transforms_sha256",
                     "target_map_sha256"):
            check_digest(getattr(self, name), name)

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "model_config_sha256": self.config_sha256,
            "model_weights_sha256": self.weights_sha256,
            "target_module_map_sha256": self.target_map_sha256,
            "weight_transform_sha256": self.transforms_sha256,
        }

    @property
    def h_base(self) -> str:
        return digest(self.to_record())


# ------------------------------------------------------------------------ artifact


@dataclass(frozen=True)
class ModuleSpec:
    """One adapted base projection: A [rank, d_in], B [d_out, rank], s = rule(alpha, rank).

    `name` is the canonical base-module name (e.g. "model.layers.0.self_attn.q_proj"),
    `role` its target role ("q_proj"), `base_shape` the base weight shape (d_out, d_in),
    `alpha` the exact LoRA alpha, `scaling_rule` one of SCALING_RULES, `dtype` the factor
    dtype, `a_sha256`/`b_sha256` SHA-256 of the raw little-endian factor bytes.
    """

    name: str
    role: str
    base_shape: tuple[int, int]
    rank: int
    alpha: Fraction
    scaling_rule: str
    dtype: str
    a_sha256: str
    b_sha256: str

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        check_text(self.role, "role")
        if len(self.base_shape) != 2:
            raise IdentityError("invalid_field", "base_shape must be (d_out, d_in)")
        for dim in self.base_shape:
            check_count(dim, "base_shape", minimum=1)
        check_count(self.rank, "rank", minimum=1)
        if not isinstance(self.alpha, Fraction):
            raise IdentityError("invalid_field", "alpha must be a Fraction")
        if self.scaling_rule not in SCALING_RULES:
            raise IdentityError("invalid_field", f"unknown scaling rule {self.scaling_rule!r}")
        if self.dtype not in DTYPE_BYTES:
            raise IdentityError("invalid_field", f"unknown dtype {self.dtype!r}")
        check_digest(self.a_sha256, "a_sha256")
        check_digest(self.b_sha256, "b_sha256")

    @property
    def d_out(self) -> int:
        return self.base_shape[0]

    @property
    def d_in(self) -> int:
        return self.base_shape[1]

    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.rank, self.d_in)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.d_out, self.rank)

    @property
    def scale_squared(self) -> Fraction:
        """s² exactly (alpha²/r² or alpha²/r for rsLoRA): s itself may be irrational."""
        if self.scaling_rule == SCALING_ALPHA_OVER_R:
            return self.alpha**2 / self.rank**2
        return self.alpha**2 / self.rank

    @property
    def scale(self) -> float:
        """s as a float, for kernels only; never hashed."""
        if self.scaling_rule == SCALING_ALPHA_OVER_R:
            return float(self.alpha / self.rank)
        return float(self.alpha) / self.rank**0.5

    @property
    def scalars(self) -> int:
        return self.rank * (self.d_in + self.d_out)

    @property
    def nbytes(self) -> int:
        return self.scalars * DTYPE_BYTES[self.dtype]

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "name": self.name,
            "role": self.role,
            "base_shape": list(self.base_shape),
            "rank": self.rank,
            "alpha": fraction_record(self.alpha),
            "scaling_rule": self.scaling_rule,
            "dtype": self.dtype,
            "a_axes": list(A_AXES),
            "b_axes": list(B_AXES),
            "a_shape": list(self.a_shape),
            "b_shape": list(self.b_shape),
            "a_sha256": self.a_sha256,
            "b_sha256": self.b_sha256,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ModuleSpec:
        """Inverse of to_record; derived fields (axes, factor shapes) must agree."""
        try:
            alpha = record["alpha"]
            spec = cls(
                name=record["name"], role=record["role"],
                base_shape=(record["base_shape"][0], record["base_shape"][1]),
                rank=record["rank"],
                alpha=Fraction(check_count(alpha["num"], "alpha.num"),
                               check_count(alpha["den"], "alpha.den", minimum=1)),
                scaling_rule=record["scaling_rule"], dtype=record["dtype"],
                a_sha256=record["a_sha256"], b_sha256=record["b_sha256"],
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise IdentityError("invalid_field", f"module record: {exc!r}") from exc
        if spec.to_record() != dict(record):
            raise IdentityError("inconsistent_record", f"module record {spec.name} drifted")
        return spec


def check_module_order(modules: Sequence[ModuleSpec]) -> None:
    """Module specs must be strictly sorted by name: no duplicates, no reordering."""
    for prev, cur in itertools.pairwise(modules):
        if cur.name == prev.name:
            raise IdentityError("duplicate_module", f"module {cur.name} appears twice")
        if cur.name < prev.name:
            raise IdentityError("unsorted_modules", f"{cur.name} sorts before {prev.name}")


@dataclass(frozen=True)
class ArtifactIdentity:
    """Inputs of H_artifact. Alias, path, URI and human revision are not part of it."""

    method: str
    peft_config_sha256: str
    h_base: str
    modules: tuple[ModuleSpec, ...]

    def __post_init__(self) -> None:
        check_text(self.method, "method")
        check_digest(self.peft_config_sha256, "peft_config_sha256")
        check_digest(self.h_base, "h_base")
        if not self.modules:
            raise IdentityError("no_modules", "an artifact adapts at least one module")
        check_module_order(self.modules)

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "method": self.method,
            "peft_config_sha256": self.peft_config_sha256,
            "h_base": self.h_base,
            "modules": [m.to_record() for m in self.modules],
        }

    @property
    def h_artifact(self) -> str:
        return digest(self.to_record())


# ------------------------------------------------------------------------ semantic

ALWAYS_ON_POLICY: dict[str, JSONValue] = {"kind": "always_on"}


def activation_policy_sha256(invocation_tokens: Sequence[int] | None = None) -> str:
    """Digest of when the adapter applies: always (LoRA) or after invocation tokens (aLoRA)."""
    if invocation_tokens is None:
        return digest(ALWAYS_ON_POLICY)
    tokens = [check_count(t, "invocation token") for t in invocation_tokens]
    if not tokens:
        raise IdentityError("invalid_field", "aLoRA needs at least one invocation token")
    return digest({"kind": "alora", "invocation_tokens": tokens})


ALWAYS_ON_POLICY_SHA256 = activation_policy_sha256()


def h_adapter_semantic(h_base: str, h_artifact: str,
                       policy_sha256: str = ALWAYS_ON_POLICY_SHA256) -> str:
    """The base-plus-adapter function a client asks for (independent of physical layout)."""
    return digest({
        "h_base": check_digest(h_base, "h_base"),
        "h_artifact": check_digest(h_artifact, "h_artifact"),
        "activation_policy_sha256": check_digest(policy_sha256, "activation_policy_sha256"),
    })


# ------------------------------------------------------------- local kernel + shards

REPLICATED = "replicated"
SPLIT_INPUT = "split_input"
SPLIT_OUTPUT = "split_output"


@dataclass(frozen=True)
class ShardRange:
    """Half-open range [start, stop) of one logical axis held by a TP rank."""

    axis: str
    start: int
    stop: int

    def __post_init__(self) -> None:
        check_text(self.axis, "axis")
        check_count(self.start, "start")
        if check_count(self.stop, "stop") <= self.start:
            raise IdentityError("invalid_field", "shard range must be non-empty")

    @property
    def size(self) -> int:
        return self.stop - self.start

    def to_record(self) -> dict[str, JSONValue]:
        return {"axis": self.axis, "start": self.start, "stop": self.stop}


@dataclass(frozen=True)
class LocalModuleLayout:
    """How one TP rank physically stores one module's factors.

    `a_axes`/`b_axes` give the physical axis order (e.g. B stored as ("rank", "output")
    for an expand kernel); `a_shard`/`b_shard` the slice of the logical factor held
    locally, None when replicated. Local scalar count follows from these and the spec.
    """

    name: str
    a_axes: tuple[str, str]
    b_axes: tuple[str, str]
    a_shard: ShardRange | None
    b_shard: ShardRange | None

    def __post_init__(self) -> None:
        if sorted(self.a_axes) != sorted(A_AXES) or sorted(self.b_axes) != sorted(B_AXES):
            raise IdentityError("invalid_field", f"{self.name}: axes must permute A/B axes")

    def local_scalars(self, spec: ModuleSpec) -> int:
        """Scalars of A and B this rank stores: each factor is the product of its two
        logical axis lengths, with the sharded axis (whichever it is) cut to its range.

        A has axes (rank, input), B (output, rank); a shard names the axis it splits, so
        A split on the rank axis (paper column schedule) keeps all `d_in` columns of
        `r/N` rows, while A split on the input axis keeps all `r` rows. A shard on an axis
        the factor lacks, or past that axis' length, raises `layout_mismatch`.
        """
        if spec.name != self.name:
            raise IdentityError("layout_mismatch", f"layout {self.name} vs spec {spec.name}")
        a = _local_factor_size(self.name, "A", {"rank": spec.rank, "input": spec.d_in},
                               self.a_shard)
        b = _local_factor_size(self.name, "B", {"output": spec.d_out, "rank": spec.rank},
                               self.b_shard)
        return a + b

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "name": self.name,
            "a_axes": list(self.a_axes),
            "b_axes": list(self.b_axes),
            "a_shard": None if self.a_shard is None else self.a_shard.to_record(),
            "b_shard": None if self.b_shard is None else self.b_shard.to_record(),
        }


def _local_factor_size(name: str, factor: str, dims: dict[str, int],
                       shard: ShardRange | None) -> int:
    """Product of `dims` (logical axis -> length) with `shard`'s axis cut to its range."""
    if shard is not None:
        if shard.axis not in dims:
            raise IdentityError("layout_mismatch", f"{name}: {factor} has no "
                                f"{shard.axis!r} axis (axes {sorted(dims)})")
        if shard.stop > dims[shard.axis]:
            raise IdentityError("layout_mismatch", f"{name}: {factor} shard "
                                f"[{shard.start}, {shard.stop}) exceeds {shard.axis} "
                                f"length {dims[shard.axis]}")
        dims = {**dims, shard.axis: shard.size}
    size = 1
    for length in dims.values():
        size *= length
    return size


def _split(dim: int, tp_rank: int, tp_size: int, axis: str) -> ShardRange:
    if dim % tp_size:
        raise IdentityError("indivisible_shard", f"{axis} dim {dim} not divisible by {tp_size}")
    size = dim // tp_size
    return ShardRange(axis, tp_rank * size, (tp_rank + 1) * size)


def tp_local_layout(spec: ModuleSpec, *, tp_rank: int, tp_size: int, split: str,
                    b_axes: tuple[str, str] = ("rank", "output")) -> LocalModuleLayout:
    """Layout of `spec` on TP rank `tp_rank` of `tp_size`.

    split=SPLIT_OUTPUT (column-parallel base, e.g. q/k/v/gate/up): A replicated, B rows
    [q*d_out/T, (q+1)*d_out/T). split=SPLIT_INPUT (row-parallel base, o/down): A columns
    sharded over input, B replicated (partial sums reduced with the base output).
    split=REPLICATED: both whole.
    """
    check_count(tp_size, "tp_size", minimum=1)
    if check_count(tp_rank, "tp_rank") >= tp_size:
        raise IdentityError("invalid_field", "tp_rank must be < tp_size")
    a_shard = b_shard = None
    if split == SPLIT_OUTPUT:
        b_shard = _split(spec.d_out, tp_rank, tp_size, "output")
    elif split == SPLIT_INPUT:
        a_shard = _split(spec.d_in, tp_rank, tp_size, "input")
    elif split != REPLICATED:
        raise IdentityError("invalid_field", f"unknown split {split!r}")
    return LocalModuleLayout(spec.name, A_AXES, b_axes, a_shard, b_shard)


@dataclass(frozen=True)
class KernelLocalIdentity:
    """Inputs of H_kernel_local: what one kernel on one TP rank may consume."""

    adapter_semantic: str
    kernel_family: str
    conversion_revision: int
    dtype: str
    packing: str
    layouts: tuple[LocalModuleLayout, ...]
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        check_digest(self.adapter_semantic, "adapter_semantic")
        check_text(self.kernel_family, "kernel_family")
        check_count(self.conversion_revision, "conversion_revision")
        if self.dtype not in DTYPE_BYTES:
            raise IdentityError("invalid_field", f"unknown dtype {self.dtype!r}")
        check_text(self.packing, "packing")
        check_count(self.tp_size, "tp_size", minimum=1)
        if check_count(self.tp_rank, "tp_rank") >= self.tp_size:
            raise IdentityError("invalid_field", "tp_rank must be < tp_size")
        names = [layout.name for layout in self.layouts]
        if len(set(names)) != len(names):
            raise IdentityError("duplicate_module", "a module has two local layouts")
        if names != sorted(names):
            raise IdentityError("unsorted_modules", "local layouts must be sorted by name")

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "h_adapter_semantic": self.adapter_semantic,
            "kernel_family": self.kernel_family,
            "conversion_revision": self.conversion_revision,
            "dtype": self.dtype,
            "packing": self.packing,
            "local_module_layouts": [layout.to_record() for layout in self.layouts],
            "parallel_shard": {"tp_rank": self.tp_rank, "tp_size": self.tp_size},
        }

    @property
    def h_kernel_local(self) -> str:
        return digest(self.to_record())


# ------------------------------------------------------------------------ residency


@dataclass(frozen=True)
class ResidencyLedger:
    """Analytical factor residency: logical artifact vs what each TP rank stores.

    Counts factor scalars/bytes only (no page rounding, pointer tables or workspace).
    `across_ranks_bytes` exceeds `logical_bytes` exactly by what replication duplicates.
    """

    logical_scalars: int
    logical_bytes: int
    per_rank_scalars: tuple[int, ...]
    per_rank_bytes: tuple[int, ...]

    @property
    def across_ranks_scalars(self) -> int:
        return sum(self.per_rank_scalars)

    @property
    def across_ranks_bytes(self) -> int:
        return sum(self.per_rank_bytes)

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "logical_scalars": self.logical_scalars,
            "logical_bytes": self.logical_bytes,
            "per_rank_scalars": list(self.per_rank_scalars),
            "per_rank_bytes": list(self.per_rank_bytes),
        }


def residency_ledger(modules: Sequence[ModuleSpec], *, tp_size: int = 1,
                     split_by_role: Mapping[str, str] | None = None) -> ResidencyLedger:
    """Ledger for `modules` under TP degree `tp_size`.

    `split_by_role` maps a module role to REPLICATED/SPLIT_INPUT/SPLIT_OUTPUT; roles not
    listed use SPLIT_OUTPUT (column-parallel), the common q/k/v/gate/up case.
    """
    check_module_order(modules)
    splits = dict(split_by_role or {})
    per_rank_scalars: list[int] = []
    per_rank_bytes: list[int] = []
    for q in range(check_count(tp_size, "tp_size", minimum=1)):
        scalars = nbytes = 0
        for spec in modules:
            layout = tp_local_layout(spec, tp_rank=q, tp_size=tp_size,
                                     split=splits.get(spec.role, SPLIT_OUTPUT))
            local = layout.local_scalars(spec)
            scalars += local
            nbytes += local * DTYPE_BYTES[spec.dtype]
        per_rank_scalars.append(scalars)
        per_rank_bytes.append(nbytes)
    return ResidencyLedger(
        logical_scalars=sum(m.scalars for m in modules),
        logical_bytes=sum(m.nbytes for m in modules),
        per_rank_scalars=tuple(per_rank_scalars),
        per_rank_bytes=tuple(per_rank_bytes),
    )


# ------------------------------------------------------------------------- bindings


@dataclass(frozen=True)
class RequestBinding:
    """Which request attempt selected which semantic contract (never a slot or row)."""

    namespace: str
    request_id: str
    attempt: int
    h_base: str
    adapter_semantic: str | None
    generation_policy_sha256: str
    lineage_id: str | None = None

    def __post_init__(self) -> None:
        check_text(self.namespace, "namespace")
        check_text(self.request_id, "request_id")
        check_count(self.attempt, "attempt")
        check_digest(self.h_base, "h_base")
        if self.adapter_semantic is not None:
            check_digest(self.adapter_semantic, "adapter_semantic")
        check_digest(self.generation_policy_sha256, "generation_policy_sha256")

    @property
    def sha256(self) -> str:
        return digest({
            "request_namespace": self.namespace, "request_id": self.request_id,
            "attempt": self.attempt, "lineage_id": self.lineage_id, "h_base": self.h_base,
            "h_adapter_semantic": self.adapter_semantic,
            "generation_policy_sha256": self.generation_policy_sha256,
        })


@dataclass(frozen=True)
class SlotBinding:
    """Which physical slot generation currently publishes an adapter on one worker."""

    worker_epoch: int
    device_id: str
    slot_index: int
    slot_generation: int
    pointer_table_generation: int
    adapter_semantic: str
    kernel_local: str

    def __post_init__(self) -> None:
        for name in ("worker_epoch", "slot_index", "slot_generation",
                     "pointer_table_generation"):
            check_count(getattr(self, name), name)
        check_text(self.device_id, "device_id")
        check_digest(self.adapter_semantic, "adapter_semantic")
        check_digest(self.kernel_local, "kernel_local")

    @property
    def sha256(self) -> str:
        return digest({
            "worker_epoch": self.worker_epoch, "device_id": self.device_id,
            "slot_index": self.slot_index, "slot_generation": self.slot_generation,
            "pointer_table_generation": self.pointer_table_generation,
            "h_adapter_semantic": self.adapter_semantic, "h_kernel_local": self.kernel_local,
        })


@dataclass(frozen=True)
class CacheABI:
    """Under which model state K/V rows are produced and may be reused.

    `adapter_semantic` is None for base-only rows (no adapter, or a proven-inactive aLoRA
    interval); then only `h_base` identifies the model state. `kv_dtype`, `block_tokens`
    and the TP shard describe the K/V representation.
    """

    h_base: str
    adapter_semantic: str | None
    kv_dtype: str
    block_tokens: int
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        check_digest(self.h_base, "h_base")
        if self.adapter_semantic is not None:
            check_digest(self.adapter_semantic, "adapter_semantic")
        check_text(self.kv_dtype, "kv_dtype")
        check_count(self.block_tokens, "block_tokens", minimum=1)
        check_count(self.tp_size, "tp_size", minimum=1)
        if check_count(self.tp_rank, "tp_rank") >= self.tp_size:
            raise IdentityError("invalid_field", "tp_rank must be < tp_size")

    @property
    def sha256(self) -> str:
        return digest({
            "h_base": self.h_base, "h_adapter_semantic": self.adapter_semantic,
            "kv_dtype": self.kv_dtype, "block_tokens": self.block_tokens,
            "parallel_shard": {"tp_rank": self.tp_rank, "tp_size": self.tp_size},
        })


EMPTY_SIDE_INPUTS_SHA256 = digest({})


def prefix_key(cache_abi_sha256: str, token_ids: Iterable[int], *,
               isolation_namespace: str,
               side_inputs_sha256: str = EMPTY_SIDE_INPUTS_SHA256) -> str:
    """Exact-prefix identity. Excludes request id/attempt, slot, sampling policy, alias."""
    tokens = [check_count(t, "token id") for t in token_ids]
    return digest({
        "cache_abi_sha256": check_digest(cache_abi_sha256, "cache_abi_sha256"),
        "prompt_tokens_sha256": digest(tokens),
        "side_inputs_sha256": check_digest(side_inputs_sha256, "side_inputs_sha256"),
        "isolation_namespace": check_text(isolation_namespace, "isolation_namespace"),
    })

