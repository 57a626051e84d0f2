"""A minimal, independent safetensors writer for building malformed files in tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CODES = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
         np.dtype("int8"): "I8", np.dtype("int32"): "I32"}


def header_for(tensors: dict[str, np.ndarray]) -> tuple[dict[str, object], bytes]:
    header: dict[str, object] = {}
    data = bytearray()
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": CODES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return header, bytes(data)


def write_raw(path: Path, header_text: bytes, data: bytes) -> None:
    path.write_bytes(len(header_text).to_bytes(8, "little") + header_text + data)


def write(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, data = header_for(tensors)
    write_raw(path, json.dumps(header).encode(), data)


def read(path: Path) -> dict[str, np.ndarray]:
    """Parse a little-endian F32/F16 file written by safetensors (test-side reader)."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = {"F32": "<f4", "F16": "<f2"}[entry["dtype"]]
        out[name] = np.frombuffer(blob[8 + n + begin:8 + n + end], dtype=dtype).reshape(
            entry["shape"]).copy()
    return out
