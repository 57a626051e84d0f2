"""Typed errors of collection fitting (Compress then Serve): stable codes, JSON-able detail."""

from __future__ import annotations

from dataplane.errors import EngineError


class CollectionError(EngineError):
    """A collection cannot be fitted or loaded as asked (bad shapes, rank, method, bundle)."""

    code = "COLLECTION_INVALID"


class ReleaseRefused(CollectionError):
    """The fitted collection reconstructs some adapter worse than the release threshold."""

    code = "COLLECTION_RELEASE_REFUSED"
