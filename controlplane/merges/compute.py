"""The arithmetic of an immutable merged release: a base checkpoint plus an ordered list of
LoRA deltas, accumulated in float32 and rounded once to the release dtype.

For one base projection W [d_out, d_in] adapted by the release's adapters 1..n, in order,
with factors A_i [r_i, d_in], B_i [d_out, r_i] and effective scale c_i = w_i · s_i (w_i the
adapter's weight in the release, s_i its PEFT scale alpha/r or alpha/sqrt(r)):

    W' = Q( ((float32(W) + c_1 · B_1 A_1) + c_2 · B_2 A_2) + ... )

Every delta is computed in float32 from the stored factors, never by arithmetic on an
already rounded merged weight; the sum runs in float32 in release order; Q, round to
nearest even to bf16/fp16/fp32, is applied exactly once. Tensors no adapter touches are
cast once to the same dtype. The job never *unmerges* (subtracts a delta from a merged
tensor): in binary16, 2048 + 1 rounds to 2048 and 2048 - 1 is 2047, so subtraction is not
a rollback. The clean base stays the rollback source and a merge always starts from it.

Memory: tensors are read one at a time through `safe_open` and written in shards planned
from the base's headers, so the process holds at most one output shard (`shard_bytes`, or
one tensor when a tensor alone is larger) plus one module's float32 working set: W and the
running sum (2 · 4 · d_out · d_in bytes), one delta at a time, and that module's factors.

No database or service imports: the job (`job.py`) and the tests call this directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dataplane.artifacts import WEIGHTS_FILE, BaseModelABI, ValidatedArtifact
from dataplane.artifacts.base_abi import weight_files
from dataplane.identity import DTYPE_BYTES, sha256_hex

RELEASE_DTYPES: Mapping[str, torch.dtype] = {
    "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
"""Release dtype names (API, CLI) -> torch dtypes."""
DTYPE_NAMES: Mapping[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""Release dtype names -> the checkpoint dtype names of `BaseModelABI.dtype`."""
DEFAULT_SHARD_BYTES = 1 << 30
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
PROVENANCE_DTYPE_KEYS = ("torch_dtype", "dtype")


class MergeInputError(Exception):
    """An input the merge cannot use (a code of `job.py`'s rejections and a message)."""

    def __init__(self, code: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = dict(detail)


@dataclass(frozen=True)
class Delta:
    """One adapter's update of one module: ΔW = scale · B @ A (A [r, d_in], B [d_out, r])."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float


def merge_weight(weight: torch.Tensor, deltas: Sequence[Delta],
                 dtype: torch.dtype) -> torch.Tensor:
    """Q_dtype(float32(W) + Σ_i scale_i · B_i A_i), summed in the given order, rounded once."""
    acc = weight.to(torch.float32, copy=True)
    for delta in deltas:
        acc += (delta.b.to(torch.float32) @ delta.a.to(torch.float32)) * delta.scale
    return acc.to(dtype)


@dataclass(frozen=True)
class MergeAdapter:
    """A validated adapter directory in the release, its weight and its module specs."""

    directory: Path
    artifact: ValidatedArtifact
    weight: Fraction

    def scale(self, module: str) -> float:
        """c = w · s for `module` (s from the module spec: alpha/r or alpha/sqrt(r))."""
        spec = next(m for m in self.artifact.modules if m.name == module)
        return float(self.weight) * spec.scale

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(m.name for m in self.artifact.modules)

    def delta(self, module: str) -> Delta:
        prefix = f"base_model.model.{module}"
        with safe_open(str(self.directory / WEIGHTS_FILE), framework="pt") as handle:
            return Delta(handle.get_tensor(f"{prefix}.lora_A.weight"),
                         handle.get_tensor(f"{prefix}.lora_B.weight"), self.scale(module))


def load_merge_adapter(directory: Path, base: BaseModelABI, weight: Fraction, *,
                       expected_h_artifact: str, max_rank: int) -> MergeAdapter:
    """Validate a stored adapter directory against the base again (the one reading of PEFT
    configs and factors: `validate_peft_dir`) and check its bytes re-derive the recorded
    H_artifact; an activated LoRA is refused (a merged weight applies to every token)."""
    from dataplane.artifacts import ArtifactLimits, ArtifactRejected, validate_peft_dir

    try:
        artifact = validate_peft_dir(directory, base, ArtifactLimits(max_rank=max_rank))
    except ArtifactRejected as exc:
        raise MergeInputError("source_invalid", f"adapter rejected: {exc.message}",
                              rejection=exc.code.value) from exc
    if artifact.h_artifact != expected_h_artifact:
        raise MergeInputError("source_invalid", "adapter bytes do not re-derive its H_artifact",
                              expected=expected_h_artifact, derived=artifact.h_artifact)
    if artifact.invocation_tokens is not None:
        raise MergeInputError("alora_unsupported", "an activated LoRA cannot be merged: its "
                              "update applies only after its invocation tokens")
    return MergeAdapter(directory, artifact, weight)


@dataclass(frozen=True)
class MergedCheckpoint:
    """What `merge_checkpoint` wrote: tensor digests ({name: {dtype, shape, sha256}}, the
    record `read_base_abi` hashes into weights_sha256), the files, the adapted modules."""

    tensors: dict[str, dict[str, Any]]
    files: tuple[str, ...]
    modules: tuple[str, ...]


def _base_tensors(base_dir: Path) -> dict[str, Path]:
    where: dict[str, Path] = {}
    for path in weight_files(base_dir):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                where[name] = path
    return where


def _shard_plan(names: Sequence[str], where: Mapping[str, Path], out_bytes: int,
                shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name in names:
        with safe_open(str(where[name]), framework="pt") as handle:
            shape = handle.get_slice(name).get_shape()
        size = out_bytes * _numel(shape)
        if shards[-1] and used + size > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _tensor_record(tensor: torch.Tensor, dtype_name: str) -> dict[str, Any]:
    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    return {"dtype": dtype_name, "shape": list(tensor.shape), "sha256": sha256_hex(raw)}


def _merged_tensors(names: Sequence[str], where: Mapping[str, Path],
                    adapters: Sequence[MergeAdapter], dtype: torch.dtype
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    for name in names:
        with safe_open(str(where[name]), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        module = name.removesuffix(".weight")
        deltas = [a.delta(module) for a in adapters
                  if name.endswith(".weight") and module in a.modules]
        yield name, merge_weight(tensor, deltas, dtype) if deltas else tensor.to(dtype)


def merge_checkpoint(base_dir: Path, base: BaseModelABI, adapters: Sequence[MergeAdapter],
                     release_dtype: str, out_dir: Path, *,
                     shard_bytes: int = DEFAULT_SHARD_BYTES) -> MergedCheckpoint:
    """Write the merged checkpoint of `adapters` (in order) over the base in `base_dir` to
    `out_dir`: config.json plus model.safetensors, or shards and their index.

    Raises MergeInputError for an unknown dtype or an adapter of another base; the caller
    has validated each adapter directory (`validate_peft_dir`) into `MergeAdapter.artifact`.
    """
    if release_dtype not in RELEASE_DTYPES:
        raise MergeInputError("unknown_dtype", f"dtype must be one of {sorted(RELEASE_DTYPES)}",
                              dtype=release_dtype)
    if not adapters:
        raise MergeInputError("no_adapters", "a merged release needs at least one adapter")
    for index, adapter in enumerate(adapters):
        if adapter.artifact.h_base != base.h_base:
            raise MergeInputError("base_mismatch", f"adapter {index} belongs to another base",
                                  index=index, h_base=adapter.artifact.h_base)
        unknown = sorted(adapter.modules - set(base.module_shapes))
        if unknown:
            raise MergeInputError("unknown_module", f"adapter {index} adapts {unknown[0]}",
                                  index=index, modules=unknown[:8])
    dtype = RELEASE_DTYPES[release_dtype]
    dtype_name = DTYPE_NAMES[release_dtype]
    where = _base_tensors(base_dir)
    names = sorted(where)
    shards = _shard_plan(names, where, DTYPE_BYTES[dtype_name], shard_bytes)
    files = _shard_names(len(shards))
    out_dir.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, Any]] = {}
    stream = _merged_tensors(names, where, adapters, dtype)
    weight_map: dict[str, str] = {}
    for file_name, shard in zip(files, shards, strict=True):
        tensors: dict[str, torch.Tensor] = {}
        for _ in shard:
            name, tensor = next(stream)
            tensors[name] = tensor.contiguous()
            records[name] = _tensor_record(tensors[name], dtype_name)
            weight_map[name] = file_name
        save_file(tensors, str(out_dir / file_name), metadata={"format": "pt"})
        del tensors
    written = list(files)
    if len(files) > 1:
        total = sum(_numel(r["shape"]) * DTYPE_BYTES[dtype_name] for r in records.values())
        (out_dir / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map},
            indent=1, sort_keys=True))
        written.append(INDEX_FILE)
    _write_config(base_dir / CONFIG_FILE, out_dir / CONFIG_FILE, dtype_name)
    written.append(CONFIG_FILE)
    modules = sorted(set().union(*(a.modules for a in adapters)))
    return MergedCheckpoint(records, tuple(sorted(written)), tuple(modules))


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _write_config(source: Path, dest: Path, dtype_name: str) -> None:
    """The base's config.json with its dtype fields naming the release dtype (provenance
    keys, outside config_sha256: the architecture is unchanged)."""
    config = json.loads(source.read_text())
    if not isinstance(config, dict):
        raise MergeInputError("malformed_base", "config.json is not an object")
    for key in PROVENANCE_DTYPE_KEYS:
        config[key] = dtype_name
    dest.write_text(json.dumps(config, indent=1, sort_keys=True))
