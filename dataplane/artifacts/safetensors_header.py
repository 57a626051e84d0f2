"""Strict safetensors reading without torch: header parsing, tensor byte streaming, finiteness.

File layout: 8-byte little-endian u64 N, then N bytes of UTF-8 JSON header, then the data
region. Header: {name: {"dtype": str, "shape": [int], "data_offsets": [begin, end]},
"__metadata__"?: {str: str}}; offsets are relative to the data region. We refuse duplicate
keys, overlapping or out-of-bounds ranges and ranges whose size is not dtype x shape.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dataplane.artifacts.errors import ArtifactRejected, RejectionCode

MAX_HEADER_BYTES = 100 * 1024 * 1024
CHUNK_BYTES = 1 << 20

DTYPE_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
}
"""safetensors dtype code -> our dtype name (torch spelling)."""
ITEM_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
    "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file; `begin`/`end` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _malformed(path: Path, message: str, **detail: object) -> ArtifactRejected:
    return ArtifactRejected(RejectionCode.MALFORMED_SAFETENSORS, f"{path.name}: {message}",
                            {"file": path.name, **detail})


def _no_duplicates(path: Path) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """A JSON object hook that refuses a key named twice (DUPLICATE_MODULE)."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise ArtifactRejected(
                    RejectionCode.DUPLICATE_MODULE,
                    f"{path.name}: tensor {key!r} appears twice in the header",
                    {"file": path.name, "key": key})
            out[key] = value
        return out

    return hook


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and check the header of `path`. Returns (tensors by name, metadata).

    Raises ArtifactRejected(MALFORMED_SAFETENSORS), or DUPLICATE_MODULE when the header
    names one tensor twice.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _malformed(path, "shorter than the 8-byte header length")
        n = int.from_bytes(prefix, "little")
        if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
            raise _malformed(path, f"header length {n} impossible for a {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates(path))
    except (UnicodeDecodeError, ValueError) as exc:  # the hook's ArtifactRejected passes
        raise _malformed(path, f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _malformed(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _malformed(path, "__metadata__ must map strings to strings")
    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(path, name, entry, data_start, data_len)
    spans = sorted((t.begin, t.end, t.name) for t in tensors.values())
    for (_, prev_end, prev), (begin, _, cur) in itertools.pairwise(spans):
        if begin < prev_end:
            raise _malformed(path, f"tensors {prev!r} and {cur!r} overlap", key=cur)
    covered = sum(t.nbytes for t in tensors.values())
    if covered != data_len:  # no holes or trailing bytes that no digest would cover
        raise _malformed(path, f"{data_len - covered} data bytes belong to no tensor")
    return tensors, metadata


def _tensor_info(path: Path, name: str, entry: object, data_start: int,
                 data_len: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _malformed(path, f"entry {name!r} is not an object", key=name)
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(code, str) or code not in DTYPE_NAMES:
        raise _malformed(path, f"tensor {name!r} has unknown dtype {code!r}", key=name)
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2
            and all(_is_count(o) for o in offsets)):
        raise _malformed(path, f"tensor {name!r} has a bad shape or data_offsets", key=name)
    begin, end = int(offsets[0]), int(offsets[1])
    dtype = DTYPE_NAMES[code]
    if end < begin or end > data_len:
        raise _malformed(path, f"tensor {name!r} lies outside the data region", key=name)
    if end - begin != math.prod(shape) * ITEM_BYTES[dtype]:
        raise _malformed(path, f"tensor {name!r}: {end - begin} bytes for {code}{shape}",
                         key=name)
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def iter_tensor_chunks(path: Path, info: TensorInfo) -> Iterator[bytes]:
    """Yield the tensor's raw bytes in chunks of at most CHUNK_BYTES."""
    with path.open("rb") as f:
        f.seek(info.begin)
        remaining = info.nbytes
        while remaining:
            chunk = f.read(min(CHUNK_BYTES, remaining))
            if not chunk:
                raise _malformed(path, f"tensor {info.name!r} is truncated", key=info.name)
            remaining -= len(chunk)
            yield chunk


def tensor_sha256(path: Path, info: TensorInfo) -> str:
    """SHA-256 of the tensor's raw (little-endian, row-major) bytes, streamed."""
    h = hashlib.sha256()
    for chunk in iter_tensor_chunks(path, info):
        h.update(chunk)
    return h.hexdigest()


def chunk_is_finite(chunk: bytes, dtype: str) -> bool:
    """No NaN/Inf in `chunk` (a whole number of elements). bf16 is checked via uint16 bits."""
    if dtype == "bfloat16":
        bits = np.frombuffer(chunk, dtype="<u2")
        return not bool(np.any((bits & 0x7F80) == 0x7F80))
    if dtype in ("float16", "float32", "float64"):
        values = np.frombuffer(chunk, dtype={"float16": "<f2", "float32": "<f4",
                                             "float64": "<f8"}[dtype])
        return bool(np.isfinite(values).all())
    return True


def hash_and_check_finite(path: Path, info: TensorInfo) -> tuple[str, bool]:
    """(sha256 of the bytes, all values finite) in one streamed pass."""
    h = hashlib.sha256()
    finite = True
    item = ITEM_BYTES[info.dtype]
    chunk_bytes = CHUNK_BYTES - CHUNK_BYTES % item
    with path.open("rb") as f:
        f.seek(info.begin)
        remaining = info.nbytes
        while remaining:
            chunk = f.read(min(chunk_bytes, remaining))
            if not chunk:
                raise _malformed(path, f"tensor {info.name!r} is truncated", key=info.name)
            remaining -= len(chunk)
            h.update(chunk)
            if finite and not chunk_is_finite(chunk, info.dtype):
                finite = False
    return h.hexdigest(), finite
