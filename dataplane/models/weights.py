"""Read HF safetensors checkpoints: one `model.safetensors` or a sharded index.

Only `safetensors.safe_open` is used (never pickle). Tensors are yielded one at a time so
peak host memory stays at one tensor beyond the model itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from dataplane.models.errors import ModelLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from its index when sharded."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"invalid {index}: {exc}") from exc
        names = sorted(set(weight_map.values()))
        files = [model_dir / name for name in names]
    elif (model_dir / SINGLE_FILE).is_file():
        files = [model_dir / SINGLE_FILE]
    else:
        raise ModelLoadError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")
    for f in files:
        if not f.is_file() or f.parent.resolve() != model_dir.resolve():
            raise ModelLoadError(f"checkpoint shard {f.name} missing from {model_dir}")
    return files


def iter_checkpoint(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, CPU tensor) for every tensor of the checkpoint, in file then key order."""
    for path in checkpoint_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield name, handle.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
