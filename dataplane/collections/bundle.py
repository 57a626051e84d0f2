"""The immutable collection bundle: shared bases, per-adapter cores, and their identity.

A core is meaningless without the exact bases it was fitted against, so identities
nest:

    basis digest (cluster c)  = digest({module: {"u": sha256(U bytes), "v": sha256(V bytes)}})
    core digest (adapter i)   = digest({"basis": basis digest of i's cluster,
                                        "cores": {module: sha256(Σ_i bytes)}})
    H_collection              = digest(manifest without "metrics")

The manifest also binds the base (`h_base`), the ordered source set (each source's
`H_artifact`), the module shapes, the method, shared rank, cluster count and the fit
settings. Tensors are float32, little-endian, in one safetensors file; `read_bundle`
re-derives every digest and refuses a bundle whose bytes or manifest disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dataplane.collections.collection_fit import CollectionFit
from dataplane.collections.errors import CollectionError
from dataplane.collections.joint_fit import JD_DIAG, METHODS
from dataplane.identity import digest, sha256_hex

BUNDLE_FORMAT = "adapterplane.collection/1"
MANIFEST_FILE = "collection.json"
TENSORS_FILE = "collection.safetensors"
TENSOR_DTYPE = torch.float32


def _tensor_sha(tensor: torch.Tensor) -> str:
    return sha256_hex(tensor.contiguous().view(torch.uint8).numpy().tobytes())


def basis_key(cluster: int, module: str, which: str) -> str:
    return f"basis.{cluster}.{module}.{which}"


def core_key(index: int, module: str) -> str:
    return f"core.{index}.{module}"


@dataclass(frozen=True)
class CollectionBundle:
    manifest: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def h_collection(self) -> str:
        return str(digest(self.manifest))

    @property
    def method(self) -> str:
        return str(self.manifest["method"])

    @property
    def assignment(self) -> list[int]:
        return [int(c) for c in self.manifest["assignment"]]

    @property
    def modules(self) -> list[str]:
        return [str(m["name"]) for m in self.manifest["modules"]]

    def bases(self, cluster: int, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(U [d_out, R], V [d_in, R])."""
        return (self.tensors[basis_key(cluster, module, "u")],
                self.tensors[basis_key(cluster, module, "v")])

    def core(self, index: int, module: str) -> torch.Tensor:
        """Σ_i as [R, R] (a JD-Diag core is expanded to its diagonal matrix)."""
        core = self.tensors[core_key(index, module)]
        return torch.diag(core) if self.method == JD_DIAG else core

    def lora_factors(self, index: int, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The member as ordinary rank-R LoRA factors with scale 1: B = U Σ_i, A = Vᵀ."""
        u, v = self.bases(self.assignment[index], module)
        return u @ self.core(index, module), v.T.contiguous()


def _digests(tensors: Mapping[str, torch.Tensor], modules: list[str], clusters: int,
             assignment: list[int]) -> tuple[list[str], list[str]]:
    basis = [digest({m: {"u": _tensor_sha(tensors[basis_key(c, m, "u")]),
                         "v": _tensor_sha(tensors[basis_key(c, m, "v")])} for m in modules})
             for c in range(clusters)]
    cores = [digest({"basis": basis[c],
                     "cores": {m: _tensor_sha(tensors[core_key(i, m)]) for m in modules}})
             for i, c in enumerate(assignment)]
    return basis, cores


def build_bundle(fit: CollectionFit, *, h_base: str, sources: list[str],
                 settings: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
                 ) -> CollectionBundle:
    """`sources`: the members' H_artifact in collection order; `settings`: the fit settings
    (JSON without floats) that belong to the identity (iterations, rounds, seed, ...)."""
    if len(sources) != len(fit.assignment):
        raise CollectionError("one source digest per fitted adapter is required")
    tensors: dict[str, torch.Tensor] = {}
    for c, cluster in enumerate(fit.bases):
        for m in fit.modules:
            u, v = cluster[m]
            tensors[basis_key(c, m, "u")] = u.to(TENSOR_DTYPE).contiguous()
            tensors[basis_key(c, m, "v")] = v.to(TENSOR_DTYPE).contiguous()
    for i, adapter_cores in enumerate(fit.cores):
        for m in fit.modules:
            tensors[core_key(i, m)] = adapter_cores[m].to(TENSOR_DTYPE).contiguous()
    shapes = [{"name": m, "d_out": int(fit.bases[0][m][0].shape[0]),
               "d_in": int(fit.bases[0][m][1].shape[0])} for m in fit.modules]
    assignment = list(fit.assignment)
    basis, cores = _digests(tensors, list(fit.modules), fit.clusters, assignment)
    manifest: dict[str, Any] = {
        "format": BUNDLE_FORMAT, "h_base": h_base, "method": fit.method, "rank": fit.rank,
        "clusters": fit.clusters, "dtype": "F32", "sources": list(sources),
        "modules": shapes, "assignment": assignment, "settings": dict(settings),
        "basis_digests": basis, "core_digests": cores,
    }
    digest(manifest)  # refuses floats and non-JSON settings up front
    return CollectionBundle(manifest, tensors, dict(metrics or {}))


def write_bundle(bundle: CollectionBundle, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(bundle.tensors, str(directory / TENSORS_FILE), metadata={"format": BUNDLE_FORMAT})
    document = {"h_collection": bundle.h_collection, "manifest": bundle.manifest,
                "metrics": bundle.metrics}
    (directory / MANIFEST_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))


def _refuse(message: str, **detail: Any) -> CollectionError:
    return CollectionError(f"collection bundle refused: {message}", **detail)


def read_bundle(directory: Path) -> CollectionBundle:
    """Load and verify a bundle: every tensor present with the manifest's shape, every
    basis/core digest and H_collection re-derived from the bytes."""
    try:
        document = json.loads((directory / MANIFEST_FILE).read_text())
        tensors = load_file(str(directory / TENSORS_FILE))
    except (OSError, ValueError) as exc:
        raise _refuse(f"unreadable ({type(exc).__name__}: {exc})") from exc
    manifest = document.get("manifest") if isinstance(document, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise _refuse("not an adapterplane collection manifest")
    if manifest.get("method") not in METHODS:
        raise _refuse("unknown method", method=manifest.get("method"))
    bundle = CollectionBundle(manifest, tensors, dict(document.get("metrics") or {}))
    rank, clusters = int(manifest["rank"]), int(manifest["clusters"])
    expected: dict[str, tuple[int, ...]] = {}
    for entry in manifest["modules"]:
        m, d_out, d_in = entry["name"], int(entry["d_out"]), int(entry["d_in"])
        for c in range(clusters):
            expected[basis_key(c, m, "u")] = (d_out, rank)
            expected[basis_key(c, m, "v")] = (d_in, rank)
        for i in range(len(manifest["sources"])):
            expected[core_key(i, m)] = (rank,) if manifest["method"] == JD_DIAG else (rank, rank)
    actual = {k: tuple(t.shape) for k, t in tensors.items()}
    if actual != expected or any(t.dtype != TENSOR_DTYPE for t in tensors.values()):
        raise _refuse("tensors disagree with the manifest",
                      missing=sorted(set(expected) - set(actual))[:8],
                      unexpected=sorted(set(actual) - set(expected))[:8])
    basis, cores = _digests(tensors, bundle.modules, clusters, bundle.assignment)
    if basis != manifest["basis_digests"] or cores != manifest["core_digests"]:
        raise _refuse("tensor bytes do not match the basis/core digests")
    if document.get("h_collection") != bundle.h_collection:
        raise _refuse("H_collection does not re-derive from the manifest")
    return bundle
