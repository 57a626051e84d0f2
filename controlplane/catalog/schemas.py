"""Catalog bodies: publish/retire/rollback requests, the alias PATCH (hot mark),
generations, resolutions."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.artifacts.schemas import ArtifactSummary

ALIAS_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$"


class CasFields(BaseModel):
    expected_generation: int | None = Field(
        default=None, ge=0, strict=True,
        description="Compare-and-swap: the alias's current generation (0: never published). "
                    "Mismatch -> 409 GENERATION_CONFLICT. Null: append after whatever is current.")
    reason: str | None = Field(default=None, max_length=2000)


class PublishRequest(CasFields):
    artifact: str = Field(description="Artifact id, or `sha256:<H_artifact>`.")


class RetireRequest(CasFields):
    pass


class RollbackRequest(CasFields):
    to_generation: int | None = Field(
        default=None, ge=1, strict=True,
        description="Generation whose artifact to restore; default: the newest earlier "
                    "generation that pointed at a different artifact than the current state.")


class AliasPatch(BaseModel):
    """Body of `PATCH /v1/namespaces/{ns}/aliases/{alias}`: the alias's hot mark."""

    model_config = ConfigDict(extra="forbid")

    hot: bool = Field(strict=True, description="Prefetch the alias's current artifact on "
                      "every compatible agent with room (true), or leave it to placement's "
                      "usual rules (false).")


class GenerationOut(BaseModel):
    namespace: str
    alias: str
    generation: int
    action: Literal["publish", "retire", "rollback"]
    artifact: ArtifactSummary | None
    actor: str
    reason: str | None
    created_at: datetime


class ResolutionOut(GenerationOut):
    base: str = Field(description="H_base the alias serves.")
    hot: bool = Field(default=False, description="Marked hot: placement prefetches the "
                      "current artifact on every compatible agent with room.")
