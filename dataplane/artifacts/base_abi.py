"""The base execution ABI: what an adapter must fit, read from an HF checkpoint directory.

`read_base_abi(dir)` reads `config.json` and the safetensors *headers* for shapes, and
streams every weight tensor through SHA-256 (no torch, nothing loaded onto a device).

Digests (all canonical JSON, see dataplane.identity):
- weights_sha256: over {tensor name: {dtype, shape, sha256 of its bytes}} — independent of
  how the checkpoint is sharded into files.
- config_sha256: over config.json minus provenance/runtime keys (PROVENANCE_KEYS), with
  decimal numbers as exact fractions.
- transforms_sha256: over the ordered list of weight transforms applied by the loader
  (none by default).
- target_map_sha256: over module_shapes, the adaptable projections
  {"model.layers.{i}.self_attn.q_proj": [d_out, d_in], ...}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataplane.artifacts.errors import ArtifactRejected, RejectionCode
from dataplane.artifacts.json_files import exact_digest, read_json_object
from dataplane.artifacts.safetensors_header import TensorInfo, read_header, tensor_sha256
from dataplane.identity import BaseIdentity, IdentityError, JSONValue, digest

PROVENANCE_KEYS = frozenset({
    "_name_or_path", "name_or_path", "_commit_hash", "transformers_version", "dtype",
    "torch_dtype", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
})
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
LAYER_PREFIX = "model.layers."


@dataclass(frozen=True)
class BaseModelABI:
    """Shapes and digests of one base checkpoint. `module_shapes` maps every adaptable
    2-D projection under `model.layers.` to its weight shape (d_out, d_in)."""

    architecture: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    dtype: str
    tie_word_embeddings: bool
    module_shapes: Mapping[str, tuple[int, int]] = field(hash=False)
    weights_sha256: str
    config_sha256: str
    transforms_sha256: str
    target_map_sha256: str

    @property
    def identity(self) -> BaseIdentity:
        return BaseIdentity(self.weights_sha256, self.config_sha256, self.transforms_sha256,
                            self.target_map_sha256)

    @property
    def h_base(self) -> str:
        return self.identity.h_base

    def to_record(self) -> dict[str, JSONValue]:
        return {
            "architecture": self.architecture, "model_type": self.model_type,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_hidden_layers": self.num_hidden_layers, "vocab_size": self.vocab_size,
            "dtype": self.dtype, "tie_word_embeddings": self.tie_word_embeddings,
            "module_shapes": {k: list(v) for k, v in sorted(self.module_shapes.items())},
            "weights_sha256": self.weights_sha256, "config_sha256": self.config_sha256,
            "transforms_sha256": self.transforms_sha256,
            "target_map_sha256": self.target_map_sha256, "h_base": self.h_base,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> BaseModelABI:
        """Rebuild from to_record(); re-derives target_map_sha256 and h_base and checks them.

        Raises ArtifactRejected(INCONSISTENT_RECORD) on drift or a malformed record.
        """
        try:
            shapes = {str(k): (int(v[0]), int(v[1]))
                      for k, v in dict(record["module_shapes"]).items()}
            abi = cls(
                architecture=str(record["architecture"]),
                model_type=str(record["model_type"]),
                hidden_size=int(record["hidden_size"]),
                intermediate_size=int(record["intermediate_size"]),
                num_attention_heads=int(record["num_attention_heads"]),
                num_key_value_heads=int(record["num_key_value_heads"]),
                num_hidden_layers=int(record["num_hidden_layers"]),
                vocab_size=int(record["vocab_size"]), dtype=str(record["dtype"]),
                tie_word_embeddings=bool(record["tie_word_embeddings"]),
                module_shapes=shapes,
                weights_sha256=str(record["weights_sha256"]),
                config_sha256=str(record["config_sha256"]),
                transforms_sha256=str(record["transforms_sha256"]),
                target_map_sha256=str(record["target_map_sha256"]),
            )
            h_base = abi.h_base
        except (KeyError, TypeError, ValueError, IndexError, IdentityError) as exc:
            raise ArtifactRejected(RejectionCode.INCONSISTENT_RECORD,
                                   f"malformed base record ({exc!r})") from exc
        if target_map_sha256(shapes) != abi.target_map_sha256:
            raise ArtifactRejected(RejectionCode.INCONSISTENT_RECORD,
                                   "module_shapes do not match target_map_sha256")
        if record.get("h_base", h_base) != h_base:
            raise ArtifactRejected(RejectionCode.INCONSISTENT_RECORD,
                                   "h_base does not re-derive from the record",
                                   {"recorded": record.get("h_base"), "derived": h_base})
        return abi


def target_map_sha256(module_shapes: Mapping[str, tuple[int, int]]) -> str:
    return digest({k: list(v) for k, v in module_shapes.items()})


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint (single file or sharded index)."""
    pickles = sorted(p.name for p in model_dir.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    index = model_dir / "model.safetensors.index.json"
    single = model_dir / "model.safetensors"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = read_json_object(index, what="weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) and "/" not in v and v.endswith(".safetensors")
            for v in weight_map.values()
        ):
            raise ArtifactRejected(RejectionCode.MALFORMED_CONFIG,
                                   "model.safetensors.index.json has no valid weight_map")
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise ArtifactRejected(RejectionCode.MISSING_FILE, f"missing shards {missing}",
                                   {"files": missing})
    elif pickles:
        raise ArtifactRejected(RejectionCode.PICKLE_WEIGHTS,
                               f"only pickle weights present ({pickles[0]})",
                               {"files": pickles})
    else:
        raise ArtifactRejected(RejectionCode.MISSING_FILE, "no model.safetensors[.index.json]")
    return files


def read_base_abi(model_dir: Path, *, transforms: Sequence[str] = ()) -> BaseModelABI:
    """Read the base ABI of the HF checkpoint in `model_dir` (see module docstring)."""
    model_dir = Path(model_dir)
    config = read_json_object(model_dir / "config.json", what="base config")
    tensors: dict[str, tuple[Path, TensorInfo]] = {}
    for path in weight_files(model_dir):
        header, _ = read_header(path)
        for name, info in header.items():
            if name in tensors:
                raise ArtifactRejected(RejectionCode.DUPLICATE_MODULE,
                                       f"tensor {name} appears in two shards", {"key": name})
            tensors[name] = (path, info)
    shapes: dict[str, tuple[int, int]] = {}
    for name, (_, info) in sorted(tensors.items()):
        if name.startswith(LAYER_PREFIX) and name.endswith(".weight") and len(info.shape) == 2:
            shapes[name.removesuffix(".weight")] = (info.shape[0], info.shape[1])
    if not shapes:
        raise ArtifactRejected(RejectionCode.MALFORMED_SAFETENSORS,
                               "no 2-D projection weights under model.layers.")
    weights = {name: {"dtype": info.dtype, "shape": list(info.shape),
                      "sha256": tensor_sha256(path, info)}
               for name, (path, info) in sorted(tensors.items())}
    dtypes = sorted({tensors[f"{m}.weight"][1].dtype for m in shapes})

    def count(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ArtifactRejected(RejectionCode.MALFORMED_CONFIG,
                                   f"config.json: {key} must be a positive integer",
                                   {"field": key})
        return value

    heads = count("num_attention_heads")
    architectures = config.get("architectures") or [config.get("model_type", "unknown")]
    return BaseModelABI(
        architecture=str(architectures[0]),
        model_type=str(config.get("model_type", "unknown")),
        hidden_size=count("hidden_size"),
        intermediate_size=count("intermediate_size"),
        num_attention_heads=heads,
        num_key_value_heads=count("num_key_value_heads", heads),
        num_hidden_layers=count("num_hidden_layers"),
        vocab_size=count("vocab_size"),
        dtype=dtypes[0] if len(dtypes) == 1 else "mixed",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        module_shapes=shapes,
        weights_sha256=digest(weights),
        config_sha256=exact_digest({k: v for k, v in config.items()
                                    if k not in PROVENANCE_KEYS}),
        transforms_sha256=digest(list(transforms)),
        target_map_sha256=target_map_sha256(shapes),
    )
