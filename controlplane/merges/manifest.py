"""The lineage manifest of a merged release and its identity H_merged.

A merged release is a new base revision, not a live adapter: its identity covers what made
its weights and the weights themselves,

    manifest = {format, source base (H_base and its component digests), ordered adapters
                (H_artifact, exact weight), dtype schedule, target signature,
                output tensors {name: {dtype, shape, sha256}}, output config digest,
                tokenizer files {name: sha256} copied from the source}
    H_merged = SHA-256(RFC 8785({"tag": H_MERGED_TAG, "manifest": manifest}))

The tag separates H_merged from every other digest over canonical JSON (a manifest can
never collide with an H_base or H_artifact record). Weights are exact fractions, never
floats. The same inputs give the same bytes (the arithmetic is deterministic on one
torch build), hence the same manifest and H_merged; the merged base's own H_base is
derived from the written checkpoint like any registered base.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dataplane.artifacts import BaseModelABI
from dataplane.identity import JSONValue, digest, fraction_record

RELEASE_FORMAT = "adapterplane.merged-release/1"
H_MERGED_TAG = "adapterplane.h_merged/1"


def dtype_schedule(release_dtype_name: str) -> dict[str, JSONValue]:
    """Where each step of `compute.merge_weight` runs and where it rounds."""
    return {"factors": "float32", "delta": "float32", "accumulate": "float32",
            "order": "release", "rounding": "once", "quantizer": "none",
            "output": release_dtype_name}


def target_signature(base: BaseModelABI, modules: Sequence[str]) -> dict[str, JSONValue]:
    """The base's module map and the modules the release changed, sorted."""
    names: list[JSONValue] = [str(m) for m in sorted(modules)]
    return {"target_map_sha256": base.target_map_sha256, "modules": names}


def build_manifest(base: BaseModelABI, adapters: Sequence[tuple[str, Fraction]],
                   release_dtype_name: str, modules: Sequence[str],
                   tensors: Mapping[str, Mapping[str, Any]],
                   output_config_sha256: str,
                   tokenizer: Mapping[str, str] | None = None) -> dict[str, JSONValue]:
    """`adapters`: (H_artifact, weight) in release order; `tokenizer`: the SHA-256 of each
    tokenizer file the release carries (a release serves text with them)."""
    return {
        "format": RELEASE_FORMAT,
        "source": {"h_base": base.h_base, **base.identity.to_record()},
        "adapters": [{"h_artifact": h, "weight": fraction_record(w)} for h, w in adapters],
        "dtype_schedule": dtype_schedule(release_dtype_name),
        "target_signature": target_signature(base, modules),
        "tensors": {name: {"dtype": str(t["dtype"]), "shape": [int(d) for d in t["shape"]],
                           "sha256": str(t["sha256"])} for name, t in sorted(tensors.items())},
        "output_config_sha256": output_config_sha256,
        "tokenizer": {name: str(sha) for name, sha in sorted((tokenizer or {}).items())},
    }


def h_merged(manifest: Mapping[str, JSONValue]) -> str:
    return digest({"tag": H_MERGED_TAG, "manifest": dict(manifest)})
