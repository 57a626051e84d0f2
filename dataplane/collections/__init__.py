"""Compress then Serve: fit shared bases for an adapter collection (docs/ARCHITECTURE.md,
"Collections (Compress then Serve)").

`fit_collection` turns n adapters' per-module updates into per-cluster bases `U, V` and
per-adapter cores (JD-Full or JD-Diag); `build_bundle` / `write_bundle` / `read_bundle`
give the immutable, digest-checked artifact; `joint_delta` is the runtime operator;
`ledger` counts parameters and break-even sizes.
"""

from dataplane.collections.bundle import (
    MANIFEST_FILE,
    TENSORS_FILE,
    CollectionBundle,
    build_bundle,
    read_bundle,
    write_bundle,
)
from dataplane.collections.collection_fit import CollectionFit, fit_collection
from dataplane.collections.errors import CollectionError, ReleaseRefused
from dataplane.collections.factored import FactoredDelta
from dataplane.collections.jd_diag import fit_jd_diag
from dataplane.collections.jd_full import fit_jd_full
from dataplane.collections.joint_fit import JD_DIAG, JD_FULL, METHODS, JointFit
from dataplane.collections.operator import joint_delta

__all__ = [
    "JD_DIAG", "JD_FULL", "MANIFEST_FILE", "METHODS", "TENSORS_FILE", "CollectionBundle",
    "CollectionError", "CollectionFit", "FactoredDelta", "JointFit", "ReleaseRefused",
    "build_bundle", "fit_collection", "fit_jd_diag", "fit_jd_full", "joint_delta",
    "read_bundle", "write_bundle",
]
